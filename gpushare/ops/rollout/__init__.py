"""Phased rollout of an environment: canary batches of bare-metal hosts with health gates, a journal to resume from,
and rollback to the last revision that succeeded.

The order is the project's (docs/architecture.md): `pulumi up` first adds the new sharing configs while keeping those
nodes still use; then the Ansible-managed hosts batch by batch (canary first), each batch one ansible-runner call of
playbooks/rollout.yml with `--limit`, followed by its health gates (playbooks/verify.yml, which runs `dcgmi diag -r 1`,
and, with a kubeconfig, the device plugin advertising each node's resources); finally `pulumi up` prunes the configs
no node uses. The first failing host stops the rollout after its batch: failed nodes stay cordoned and labelled, later
batches untouched.

Every step appends one event to a journal (JSON lines) that carries the Git revision and a snapshot of the
environment it rolled out, so an interrupted rollout resumes without repeating finished hosts, and a rollback can
re-apply the last revision that succeeded to exactly the hosts that changed since.

Modules, in the order data flows: `batches` (batch sizes, the one default), `snapshot` (the files a revision resolves
from), `journal` (events and what they say about each rollout), `plan` (the steps of a rollout, resume or rollback),
`adapters` (Ansible, Pulumi and kubectl behind the small interfaces the tests fake), `execute` (runs a plan)."""
