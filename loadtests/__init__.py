"""Load tests: locust users (``locustfile.py``), a bounded headless runner that writes a report
(``run_headless.py``) and the autoscaling check (``autoscale_check.py``).

Everything here targets a cluster on 127.0.0.1 only (``recallserve up``); see :mod:`loadtests._guard`.
"""

__all__: list[str] = []
