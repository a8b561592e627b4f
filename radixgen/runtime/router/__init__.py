"""Data-parallel serving: a router in front of several `radixgen serve` replicas.

`config.py` the router's settings (CLI flags generated from them), `prefix_tree.py` the approximate
prefix tree kept per replica, `policy.py` the routing policies (cache-aware, round robin),
`workers.py` the replicas' state (load, health, the router-side queue), `app.py` the HTTP proxy,
`metrics.py` its Prometheus metric families, `replicas.py` starting replicas for `serve --dp-size`.
"""
