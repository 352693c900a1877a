"""The package version. (``elasticjob`` is a namespace package: the folders ``operator/`` and
``worker_runtime/`` are mapped into it as ``elasticjob.operator`` and
``elasticjob.worker_runtime``, and a top-level ``operator`` must never be importable, since it
would shadow Python's standard library.)"""

__version__ = "0.1.0"
