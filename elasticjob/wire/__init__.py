"""Wire types shared by the driver, the rendezvous service and the worker runtime.

This package is the only code the two sides of the rendezvous protocol have in common, so it
imports neither torch nor kopf nor aiohttp: pydantic models and enums only. One module per
concern, each imported from where it lives:

- ``protocol.py``: the protocol's version, header and path prefix, and its messages' bounds;
- ``strict_json.py``: the strict base of every message, and parsing bodies strictly (no
  coercion, no unknown fields, no key given twice);
- ``messages.py``: the request and response bodies, and the names they carry (``WorkerId``,
  host and job names).

What a launcher tells a worker through its environment is the worker contract
(``elasticjob.worker_contract``), not part of this package.
"""
