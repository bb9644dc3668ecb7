"""Rendering from the operator's worker threads at once builds each kustomize combination once."""

import threading

from bertjob import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job


def test_threads_rendering_their_first_job_at_once_run_kustomize_once(monkeypatch):
    render.cached_build.cache_clear()  # as in a new process
    runs = []
    build = render.kustomize_build

    def counted(directory):
        runs.append(directory)
        return build(directory)

    monkeypatch.setattr(render, "kustomize_build", counted)
    job = parse_job(valid_job())
    start = threading.Barrier(6)
    results = []

    def worker():
        start.wait()
        results.append(render.render(job))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 1
    assert len(results) == 6 and all(result == results[0] for result in results)
