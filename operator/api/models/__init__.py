"""The pydantic models of the ElasticJob custom resource: its spec (``spec``) and its status
(``status``).

Fields are snake_case in Python and camelCase on the wire (pydantic aliases). The CRD under
``deploy/crds/`` is generated from these models (see ``crd.py``), so their docstrings are also
what ``kubectl explain elasticjob`` shows.
"""
