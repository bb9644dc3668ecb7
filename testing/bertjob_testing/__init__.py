"""What the tests and the benchmarks share: a Kubernetes API emulator with the operator running
against it (kmock on 127.0.0.1, ``kopf run``), and BertPretrainJob documents to feed it."""
