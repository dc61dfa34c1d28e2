"""Secret rule: API keys and tokens belong in environment files, Kubernetes Secrets or ``os.environ/``."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_ml4.preflight.model import Finding, LintContext, Severity
from pytest_ml4.preflight.rules.registry import RULES, rule


@rule("literal-secret", Severity.ERROR,
      "secret written literally into a unit/config (value not shown): it leaks through argv, journald, "
      "kubectl get and every copy of the file",
      "reference it instead: ${VAR} from an EnvironmentFile in units, os.environ/VAR in LiteLLM configs, "
      "valueFrom.secretKeyRef in Kubernetes manifests",
      "seeds/000 stable unit '--api-key ${VLLM_API_KEY}' and 'URL and key redacted'; project rule: secrets never "
      "appear in logs, reports, argv or reprs", ("vllm", "dgd", "litellm", "perf"))
def check_literal_secret(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["literal-secret"]
    for doc in ctx.documents:
        for secret in doc.secrets:
            yield r.finding(doc, f"{secret.name} in {secret.where or doc.kind}", line=secret.line,
                            where=secret.where)
