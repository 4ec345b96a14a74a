#!/usr/bin/env python3
"""Checks the deployment files without a container runtime.

    check.py validate    every manifest under kubernetes/ against the Kubernetes schemas
                         (kubernetes-validate, strict: unknown fields fail), KEDA's ScaledObjects
                         against schemas/keda-scaledobject.schema.json (strict too) and what they
                         scale, and compose.yaml against the Compose specification's schema (as
                         check-jsonschema ships it)
    check.py inventory   one JSON document: for each place that starts a binary, the binary, the
                         flags, subcommands and environment variables it is given. The Rust test
                         tests/api/deploy.rs compares them with each binary's --help.
    check.py hardening   one JSON document: for each rule of hardening.py (secret file modes,
                         secrets as files, Kafka over SASL/TLS with ACLs, egress, ingress
                         namespaces, image tags, ignore files), what it checked and what is wrong.

Exit status 0 when everything is valid, 1 otherwise.
"""

import json
import pathlib
import re
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
KUBERNETES_VERSION = "1.33.0"


def manifests():
    """(file name, document) of every Kubernetes manifest."""
    for path in sorted((HERE / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                yield path.name, document


def validate() -> int:
    import jsonschema
    import kubernetes_validate
    from check_jsonschema.builtin_schemas import get_builtin_schema

    failures = 0
    count = 0
    for name, document in manifests():
        count += 1
        what = f"{name}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
        if str(document.get("apiVersion", "")).startswith("keda.sh/"):
            problems = keda_problems(document)
            failures += bool(problems)
            for problem in problems:
                print(f"INVALID {what}: {problem}", file=sys.stderr)
            if not problems:
                print(f"valid   {what} (KEDA ScaledObject schema, strict; scales a Deployment of these manifests)")
            continue
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures += 1
            print(f"INVALID {what}: {error.message} at {'/'.join(map(str, error.path))}", file=sys.stderr)
        else:
            print(f"valid   {what} (Kubernetes {KUBERNETES_VERSION}, strict)")
    schema = get_builtin_schema("vendor.compose-spec")
    compose = yaml.safe_load((HERE / "compose.yaml").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    for error in errors:
        failures += 1
        print(f"INVALID compose.yaml: {error.message} at {'/'.join(map(str, error.path))}", file=sys.stderr)
    if not errors:
        print("valid   compose.yaml (Compose specification)")
    if count == 0:
        print("no Kubernetes manifests found", file=sys.stderr)
        return 1
    print(f"{count} Kubernetes objects and compose.yaml checked, {failures} invalid")
    return 1 if failures else 0


def keda_problems(document) -> list:
    """What is wrong with a KEDA ScaledObject: its schema, and whether it scales a Deployment
    these manifests define, within bounds."""
    import jsonschema

    schema = json.loads((HERE / "schemas" / "keda-scaledobject.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = [f"{e.message} at {'/'.join(map(str, e.path))}" for e in validator.iter_errors(document)]
    if problems:
        return problems
    spec, namespace = document["spec"], document["metadata"]["namespace"]
    target = spec["scaleTargetRef"]
    deployments = {
        (d["metadata"]["name"], d["metadata"].get("namespace"))
        for _, d in manifests()
        if d.get("kind") == "Deployment" and d.get("apiVersion") == "apps/v1"
    }
    if target.get("kind", "Deployment") != "Deployment" or (target["name"], namespace) not in deployments:
        problems.append(f"scaleTargetRef {target} is no Deployment of these manifests in {namespace}")
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        problems.append("minReplicaCount exceeds maxReplicaCount")
    return problems


def binary_of(image: str) -> str:
    """idempost-order:1.2 -> idempost-order (the image of each target is named after its binary)."""
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]


def split_args(args):
    """Flags (--name, from --name=value too) and the other words of a command line."""
    flags, words = [], []
    for arg in args or []:
        if arg.startswith("--"):
            flags.append(arg[2:].split("=", 1)[0])
        elif not arg.startswith("-"):
            words.append(arg)
    return flags, words


def kubernetes_starts():
    for name, document in manifests():
        spec = document.get("spec", {})
        pod = spec.get("template", {}).get("spec", {}) or spec.get("jobTemplate", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            env = [var["name"] for var in container.get("env", [])]
            # A variable only there to be referenced as $(NAME) by another one is no setting.
            values = " ".join(str(var.get("value", "")) for var in container.get("env", []))
            env = [var for var in env if f"$({var})" not in values]
            flags, words = split_args((container.get("command") or [])[1:] + (container.get("args") or []))
            yield {
                "source": f"kubernetes/{name} {document['kind']}/{document['metadata']['name']}",
                "binary": binary_of(container["image"]),
                "flags": flags,
                "words": words,
                "env": env,
            }


def compose_starts():
    compose = yaml.safe_load((HERE / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        image = service.get("image", "")
        if not binary_of(image).startswith("idempost"):
            continue  # the database, the broker, Jaeger
        environment = service.get("environment", {})
        env = list(environment) if isinstance(environment, dict) else [e.split("=", 1)[0] for e in environment]
        command = service.get("command", [])
        flags, words = split_args(command if isinstance(command, list) else command.split())
        yield {"source": f"compose.yaml service {name}", "binary": binary_of(image), "flags": flags, "words": words, "env": env}


def dockerfile_starts():
    """Every ENV and CMD of each final target, with the ENV of the stages it builds on."""
    stages, current = {}, None
    for line in re.sub(r"\\\n", " ", (HERE / "Dockerfile").read_text()).splitlines():
        line = line.strip()
        if match := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE):
            base = stages.get(match.group(1), {"env": [], "entrypoint": None, "cmd": []})
            current = stages[match.group(2)] = {"env": list(base["env"]), "entrypoint": None, "cmd": []}
        elif current is not None and line.startswith("ENV "):
            current["env"] += re.findall(r"(\w+)=", line[4:])
        elif current is not None and line.startswith("ENTRYPOINT "):
            current["entrypoint"] = json.loads(line[len("ENTRYPOINT "):])[0]
        elif current is not None and line.startswith("CMD ["):
            current["cmd"] = json.loads(line[len("CMD "):])
    for target, stage in stages.items():
        if stage["entrypoint"]:
            flags, words = split_args(stage["cmd"])
            yield {"source": f"Dockerfile target {target}", "binary": stage["entrypoint"], "flags": flags, "words": words, "env": stage["env"]}


def inventory() -> int:
    starts = [*kubernetes_starts(), *compose_starts(), *dockerfile_starts()]
    json.dump(starts, sys.stdout, indent=1)
    print()
    return 0


def hardening() -> int:
    import hardening as rules

    json.dump(rules.report(HERE), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    commands = {"validate": validate, "inventory": inventory, "hardening": hardening}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(commands[sys.argv[1]]())
