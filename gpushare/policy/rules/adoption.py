"""Rules over an adopted cluster: the guards its adoption: block keeps staged are each listed as a step to take."""

from __future__ import annotations

from collections.abc import Iterator

from gpushare.policy.registry import Context, Finding, rule


@rule("adoption-staged", "advisory",
      "An adopted cluster (the environment's adoption: block) keeps some of gpushare's guards staged so its first "
      "rollout breaks no running work; each is a reviewed step to take.",
      "once `gpushare diff --env ENV --kubeconfig ...` lists no running workload the step would break, set the field "
      "to its strict value (admission: deny, pod_security: enforce, shared_gpu_taint: true, host_defaults: true); "
      "docs/adoption.md walks the steps")
def _adoption_staged(ctx: Context) -> Iterator[Finding]:
    adoption = ctx.fleet.env.adoption
    for fieldname, what in adoption.staged() if adoption else []:
        yield f"environment {ctx.name}, adoption.{fieldname}", what

