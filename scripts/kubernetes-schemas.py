#!/usr/bin/env python3
"""Regenerates deploy/kubernetes/schema/kubernetes-strict.json: the strict JSON schemas of the
Kubernetes kinds our manifests use, pruned to what those kinds reference, from the schemas that
PyPI's kubernetes-validate package ships (themselves generated from Kubernetes' OpenAPI
documents). The suite (proxy/tests/manifests.rs) validates every manifest against it.

    python3 scripts/kubernetes-schemas.py [kubernetes-validate version]
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

PACKAGE_VERSION = sys.argv[1] if len(sys.argv) > 1 else "1.37.0"
KUBERNETES = "v1.37.0"
KINDS = {
    # file in the package -> (apiVersion, kind)
    "deployment-apps-v1.json": ("apps/v1", "Deployment"),
    "statefulset-apps-v1.json": ("apps/v1", "StatefulSet"),
    "service-v1.json": ("v1", "Service"),
    "poddisruptionbudget-policy-v1.json": ("policy/v1", "PodDisruptionBudget"),
    "configmap-v1.json": ("v1", "ConfigMap"),
    "secret-v1.json": ("v1", "Secret"),
}
OUT = pathlib.Path(__file__).resolve().parent.parent / "deploy/kubernetes/schema/kubernetes-strict.json"


def rewrite(node, refs):
    """Points refs into the one file's $defs, collects what they name, drops prose."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and "#/$defs/" in value:
                name = value.split("#/$defs/", 1)[1]
                refs.add(name)
                out[key] = "#/$defs/" + name
            elif key in ("$id", "$schema") or (key == "description" and isinstance(value, str)):
                continue
            else:
                out[key] = rewrite(value, refs)
        return out
    if isinstance(node, list):
        return [rewrite(v, refs) for v in node]
    return node


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
             f"kubernetes-validate=={PACKAGE_VERSION}"],
            check=True,
        )
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        base = f"kubernetes_validate/kubernetes-json-schema/{KUBERNETES}-local-strict/"
        with zipfile.ZipFile(wheel) as z:
            definitions = json.loads(z.read(base + "_definitions.json"))["$defs"]
            kinds = {name: json.loads(z.read(base + name)) for name in KINDS}
    defs, pending = {}, set()
    kinds_out = {}
    for name, schema in kinds.items():
        api_version, kind = KINDS[name]
        kinds_out[f"{api_version}/{kind}"] = rewrite(schema, pending)
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        defs[name] = rewrite(definitions[name], pending)
    document = {
        "$comment": f"Kubernetes {KUBERNETES} strict schemas from kubernetes-validate "
                    f"{PACKAGE_VERSION} (Apache-2.0), pruned by scripts/kubernetes-schemas.py",
        "kinds": kinds_out,
        "$defs": dict(sorted(defs.items())),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(f"{OUT}: {len(kinds_out)} kinds, {len(defs)} definitions")


if __name__ == "__main__":
    main()
