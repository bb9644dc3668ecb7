"""The corpus and what is made of it: sources, the WordPiece vocabulary, masking, packing and shards."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from bertjob_api.spec.base import Int64, _Spec
from bertjob_api.spec.cel import Rule, validations


class VocabSpec(_Spec):
    """The WordPiece vocabulary: trained on the corpus, or an existing file. Exactly one of the two."""

    # _one_source, for the API server (bertjob_api.spec.cel).
    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.trainSize) != has(self.file)",
                "spec.data.vocab: set exactly one of trainSize and file",
            )
        )
    )

    train_size: Int64 | None = Field(
        None, ge=64, description="Train a WordPiece vocabulary of this many tokens on the corpus."
    )
    file: str | None = Field(None, min_length=1, description="An existing vocab.txt or tokenizer.json.")
    pad_to_multiple_of: Int64 | None = Field(
        None,
        ge=1,
        description="Append [unused] tokens until the size is a multiple of this (NVIDIA pads 30522 "
        "to 30528 with 8, for tensor-core-friendly embedding shapes).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VocabSpec:
        if (self.train_size is None) == (self.file is None):
            raise ValueError("set exactly one of trainSize and file")
        return self


SourceFormat = Literal["auto", "bert", "text", "jsonl", "parquet", "wikipedia", "pubmed", "python-docs"]


class SourceSpec(_Spec):
    """One part of the corpus: a file, a directory of files, or the built-in English text."""

    path: str = Field(
        min_length=1,
        description="A file or a directory (searched recursively, in sorted order), or "
        "'builtin:python-docs': the running Python's docstrings and language reference.",
    )
    format: SourceFormat = Field(
        "auto",
        description="bert (one sentence per line, a blank line between documents), text (raw prose, "
        "one document per file), jsonl, parquet, wikipedia (XML dump, .xml or .xml.bz2), pubmed "
        "(baseline XML, .xml.gz). auto: by file name; a .txt file is bert when most lines end a "
        "sentence, text otherwise.",
    )
    field: str = Field(
        "text", min_length=1, description="The JSON Lines field or Parquet column holding text."
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="Times each document of this source is used: 2 uses every document twice, 0.5 a "
        "seeded half of them.",
    )


FINAL_MASKING_PROBLEM = (
    "spec.data.finalMaskedLmProb: a masking schedule falls from maskedLmProb (each step keeps a random "
    "share of the tokens masked at maskedLmProb) and needs dynamic masking without wholeWordMask"
)


class DataSpec(_Spec):
    """The corpus and what is made of it: vocabulary and masked-LM/NSP instances in HDF5 shards."""

    # validation.problems' checks of the data, for the API server (bertjob_api.spec.cel).
    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "!(has(self.numShards) && has(self.maxShardMB))",
                "spec.data.maxShardMB: set numShards or maxShardMB, not both",
                field_path=".maxShardMB",
            ),
            Rule(
                "self.packing == 'none' || self.masking != 'dynamic'",
                "spec.data.packing: packing needs static masking: packs are made of masked instances",
                field_path=".packing",
            ),
            Rule(
                "!has(self.finalMaskedLmProb) || (self.masking == 'dynamic' && !self.wholeWordMask "
                "&& self.finalMaskedLmProb <= self.maskedLmProb)",
                FINAL_MASKING_PROBLEM,
                field_path=".finalMaskedLmProb",
            ),
        )
    )

    sources: list[SourceSpec] = Field(min_length=1, description="The corpus: one or more sources.")
    shards: str = Field(min_length=1, description="Directory for the vocabulary and the HDF5 shards.")
    vocab: VocabSpec = Field(
        default_factory=lambda: VocabSpec(train_size=8000), description="Default: train 8000 tokens."
    )
    lowercase: bool = Field(True, description="Lower-case and strip accents (an uncased model).")
    whole_word_mask: bool = Field(
        False, description="Mask every WordPiece of a word together (Google's do_whole_word_mask)."
    )
    dupe_factor: Int64 = Field(
        5,
        ge=1,
        description="Times each training document is turned into instances, with different masks "
        "(held-out documents once).",
    )
    short_seq_prob: float = Field(
        0.1, ge=0, le=1, description="Share of instances given a shorter target length (Google's default)."
    )
    masked_lm_prob: float = Field(0.15, gt=0, lt=1, description="Share of tokens masked per instance.")
    final_masked_lm_prob: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="With dynamic masking: the masking rate at the end of each phase, at most "
        "maskedLmProb, reached linearly from it over the phase's progress (Ankner et al. 2023: 0.3 to "
        "0.15). Default: maskedLmProb throughout. Held-out rows are masked at this rate.",
    )
    masking: Literal["static", "dynamic"] = Field(
        "static",
        description="static: masks drawn once, stored in NVIDIA's HDF5 schema; dynamic: unmasked "
        "tokens stored, masks drawn afresh each epoch by the loader (RoBERTa).",
    )
    packing: Literal["none", "spfhp", "nnlshp"] = Field(
        "none",
        description="Pack several short sequences per row (Krell et al. 2021): spfhp (shortest-pack-"
        "first histogram packing) or nnlshp (non-negative least squares). Needs static masking. "
        "A phase's globalBatchSize then counts rows.",
    )
    max_sequences_per_pack: Int64 = Field(3, ge=2, le=16, description="Most sequences in one packed row.")
    num_shards: Int64 | None = Field(
        None, ge=1, description="Training shards per phase. Default 4, unless maxShardMB is set."
    )
    max_shard_mb: float | None = Field(
        None,
        alias="maxShardMB",
        gt=0,
        description="Instead of numShards: as many shards as it takes for each to come from at most "
        "this many MB of corpus text (a longer document makes a shard on its own).",
    )
    heldout_fraction: float = Field(
        0.0, ge=0, lt=1, description="Share of documents kept out of training, in held-out shards."
    )
    workers: Int64 | None = Field(
        None, ge=1, description="Processes that prepare the data. Default: the CPUs this process may use."
    )
