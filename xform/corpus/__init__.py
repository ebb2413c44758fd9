"""Corpus translation: files cut into shards, translated by a pool of sessions (in this process or
Ray actors), recorded as they finish, assembled in order. Above the runtime, beside serving:
never torch, the models or the exporter.

    formats.py   reading inputs (text, JSON lines, Parquet) and writing outputs line for line
    shards.py    the corpus cut into shards: the unit of work, retry and record
    worker.py    one session translating lines and shards (LineTranslator, ShardWorker)
    record.py    the output directory's record: identity, shards done, atomic writes, refusals
    pipeline.py  plan, translate on a pool (in-process or a Ray actor pool), assemble
    cluster.py   joining a Ray cluster; workers x threads (and GPUs) against what it holds
    local.py     `--ray local`: a Ray head on this machine owned by the command
"""
