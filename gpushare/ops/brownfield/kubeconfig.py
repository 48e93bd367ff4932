"""Loading a --kubeconfig into the Kubernetes Python client's configuration, with what is not a kubeconfig (text that
is not YAML, a YAML list, a context that is a number, bytes that are not UTF-8) as bad input naming the file (exit 2),
not as the client's own exception: it reads any file it is given and fails inside with whatever Python raised."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpushare.core.errors import EXCERPT_CHARS, GpushareError, Problem

# The largest kubeconfig that makes sense: a few contexts with their certificates inline are tens of KB.
MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024
FIX = "give the cluster's kubeconfig, e.g. `kubectl config view --minify --raw > FILE`, and one of its contexts"


def load_kubeconfig(kubeconfig: Path, context: str | None, configuration: Any, **options: Any) -> None:
    """config.load_kube_config(kubeconfig, context) into `configuration`, or a GpushareError (exit 2) naming the
    file, the option and, for text that is not YAML, the line."""
    import yaml
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    file = str(kubeconfig)
    try:
        size = os.stat(kubeconfig).st_size
    except OSError as exc:
        raise GpushareError(Problem(f"cannot read the kubeconfig: {exc.strerror or exc}", file=file,
                                    path="--kubeconfig", fix=FIX), exit_code=2) from None
    if size > MAX_KUBECONFIG_BYTES:
        raise GpushareError(Problem(f"not a kubeconfig: {size} bytes, above the limit of {MAX_KUBECONFIG_BYTES}",
                                    file=file, path="--kubeconfig", fix=FIX), exit_code=2)
    try:
        with open(kubeconfig, "rb") as handle:
            document = yaml.safe_load(handle)
        if not isinstance(document, dict):
            kind = {list: "a list", str: "text", type(None): "empty"}.get(type(document), type(document).__name__)
            raise GpushareError(Problem(f"not a kubeconfig: the top level is {kind}, not a mapping with clusters, "
                                        "contexts and users", file=file, path="--kubeconfig", fix=FIX), exit_code=2)
        config.load_kube_config(config_file=file, context=context, client_configuration=configuration, **options)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise GpushareError(Problem(f"not a kubeconfig: not valid YAML ({exc.problem})", file=file,
                                    line=mark.line + 1 if mark is not None else None, path="--kubeconfig",
                                    fix=FIX), exit_code=2) from None
    except ConfigException as exc:
        raise GpushareError(Problem(f"unusable kubeconfig: {str(exc)[:EXCERPT_CHARS]}", file=file,
                                    path="--context" if context else "--kubeconfig",
                                    fix="check the file and the context name (kubectl config get-contexts)"),
                            exit_code=2) from None
    except UnicodeDecodeError as exc:
        raise GpushareError(Problem(f"not a kubeconfig: not UTF-8 (byte at offset {exc.start})", file=file,
                                    path="--kubeconfig", fix=FIX), exit_code=2) from None
    except (yaml.YAMLError, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        # Valid YAML of another shape (a list, a string, a context that is a number): the client fails inside.
        raise GpushareError(Problem(f"not a kubeconfig: the Kubernetes client cannot read it ({type(exc).__name__}: "
                                    f"{str(exc)[:200]})", file=file, path="--kubeconfig", fix=FIX),
                            exit_code=2) from None
