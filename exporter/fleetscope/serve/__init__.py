"""How a node is served: the daemon, its collection engine, the exposition and the HTTP apps.

:mod:`.daemon` builds the daemon from the config and runs it; :mod:`.engine`
runs the collectors and caches their series; :mod:`.exposition` renders them
in the text and protobuf formats; :mod:`.app` is the FastAPI apps
(``/metrics``, ``/healthz``, ``/readyz``, the push API's app);
:mod:`.guard` is uvicorn's HTTP protocol with read deadlines and the
connection cap; :mod:`.listeners` holds the limits and counts they share.
Nothing is imported here, so :mod:`fleetscope.collectors.http` can read the
listeners' counts without pulling in the daemon.
"""
