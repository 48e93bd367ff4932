"""The one bound a user sets on gpushare's requests to a server (`--timeout`, or $GPUSHARE_TIMEOUT, on every command
that reads one: showback, capacity, promote, import, drift, rollout with AWX): how long one request may take, from
the connection to the last byte of its answer. Only constants, so that the CLI's option costs no import."""

DEFAULT_TIMEOUT = 30.0  # seconds: Prometheus's queries of recording rules and day-long chunks, a list of 5,000 nodes
MAX_TIMEOUT = 3600.0
TIMEOUT_ENV = "GPUSHARE_TIMEOUT"
TIMEOUT_FIX = (f"if the server is only slow, raise --timeout (or ${TIMEOUT_ENV}), the seconds one request may take")
# `rollout --awx-job-timeout`: how long a batch's converge or verify job may run on the controller, launch to end
AWX_JOB_TIMEOUT = 2 * 3600.0
MAX_AWX_JOB_TIMEOUT = 7 * 86400.0
# `rollout --gate-timeout`: how long a batch's nodes may take to advertise the resources the fleet expects
GATE_TIMEOUT = 300.0
