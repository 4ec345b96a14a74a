"""The deployment files' security rules, read from the files themselves (no cluster, no runtime).

report(deploy_dir) gives, for each rule, how many things it checked and what breaks it; the Rust
test tests/api/deploy.rs asserts that every rule checked something and found nothing. Each rule
says why it exists; docs/deployment.md and docs/security.md say what it leaves open.
"""

import pathlib
import re

import yaml

# The uid and gid the images run as (deploy/Dockerfile) and the manifests ask for.
UID = 10001
# Secret files: readable by the owner and the pod's fsGroup, by nobody else, written by no one.
SECRET_MODE = 0o440
# Egress each workload needs, by app.kubernetes.io/name: DNS, the database, the broker's
# SASL_SSL listener, the OTLP collector. Anything more is a hole; anything less a broken pod.
DNS, DATABASE, KAFKA, OTLP = 53, 3306, 9093, 4317
EGRESS = {
    "idempost-order": {DNS, DATABASE, OTLP},
    "idempost-relay": {DNS, DATABASE, KAFKA, OTLP},
    "idempost-consumer": {DNS, DATABASE, KAFKA, OTLP},
    "idempost-migrate": {DNS, DATABASE},
}
# The namespace label a client namespace must carry (docs/deployment.md).
CLIENTS_LABEL = {"idempost.example/clients": "true"}
# Digests verified for a base image tag (`docker buildx imagetools inspect IMAGE:TAG`): an image
# named here must be referenced as IMAGE:TAG@DIGEST. Empty: no digest could be verified where
# these files were written (no registry reachable); docs/deployment.md says how to pin.
KNOWN_DIGESTS: dict = {}
# Kafka security protocols that encrypt and authenticate the broker.
KAFKA_PROTOCOLS = {"SASL_SSL", "SSL"}
# The consumer's group when neither --consumer-group nor --consumer-name is set.
DEFAULT_CONSUMER_GROUP = "notification-planner"


def _documents(path: pathlib.Path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kubernetes(deploy: pathlib.Path):
    return [d for p in sorted((deploy / "kubernetes").glob("*.yaml")) for d in _documents(p)]


def _pods(objects):
    """(workload name, pod spec, pod labels) of every object that runs pods."""
    for o in objects:
        template = o.get("spec", {}).get("template")
        if template:
            yield o["metadata"]["name"], template["spec"], template.get("metadata", {}).get("labels", {})


def _env(container):
    return {e["name"]: e for e in container.get("env", [])}


def _mounted_secret_file(pod, container, path: str):
    """(secret name, key) of the secret volume file that `path` names in `container`, or None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret and path.startswith(prefix):
            name = path[len(prefix):]
            items = secret.get("items")
            if items is None:
                return secret["secretName"], name
            for item in items:
                if item["path"] == name:
                    return secret["secretName"], item["key"]
    return None


def secret_volumes(deploy):
    """fsGroup and 0440 on every secret volume: Kubernetes makes secret files root-owned, so with
    0400 and no fsGroup uid 10001 cannot read its own key."""
    checked, problems = 0, []
    for name, pod, _ in _pods(_kubernetes(deploy)):
        context = pod.get("securityContext", {})
        for volume in pod.get("volumes", []):
            secret = volume.get("secret")
            if not secret:
                continue
            checked += 1
            where = f"{name} volume {volume['name']}"
            if context.get("fsGroup") != UID or context.get("runAsGroup") != UID:
                problems.append(f"{where}: pod needs fsGroup and runAsGroup {UID} to read it")
            modes = [secret.get("defaultMode", 0o644)] + [i["mode"] for i in secret.get("items", []) if "mode" in i]
            for mode in modes:
                if mode != SECRET_MODE:
                    problems.append(f"{where}: mode {mode:#o}, not {SECRET_MODE:#o}")
    return checked, problems


def _compose(deploy):
    return yaml.safe_load((deploy / "compose.yaml").read_text())


def _compose_env(service):
    environment = service.get("environment", {})
    if isinstance(environment, list):
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in environment)
    return environment


def database_url_files(deploy):
    """Database URLs (they hold passwords) reach every Idempost process as a mounted file named by
    IDEMPOST_DATABASE_URL_FILE, never as an environment variable."""
    checked, problems = 0, []
    for name, pod, _ in _pods(_kubernetes(deploy)):
        for container in pod.get("containers", []):
            if not container["image"].startswith("idempost-"):
                continue
            checked += 1
            env = _env(container)
            for var in env:
                if var.endswith("DATABASE_URL"):
                    problems.append(f"{name}: the database URL in the environment variable {var}")
            path = env.get("IDEMPOST_DATABASE_URL_FILE", {}).get("value")
            if not path or not _mounted_secret_file(pod, container, path):
                problems.append(f"{name}: IDEMPOST_DATABASE_URL_FILE names no file of a mounted Secret")
    for name, service in _compose(deploy)["services"].items():
        env = _compose_env(service)
        for var, value in env.items():
            if var.endswith("DATABASE_URL") or "PASSWORD" in var and not var.endswith("_FILE") and value != "yes":
                problems.append(f"compose {name}: a secret in the environment variable {var}")
        if not str(service.get("image", "")).startswith("idempost-"):
            continue
        checked += 1
        path = env.get("IDEMPOST_DATABASE_URL_FILE")
        targets = [v["target"] for v in service.get("volumes", []) if isinstance(v, dict) and v.get("type") == "bind"]
        if not path or not any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets):
            problems.append(f"compose {name}: IDEMPOST_DATABASE_URL_FILE names no bind-mounted file")
    return checked, problems


def _options(text: str) -> dict:
    lines = (line.strip() for line in text.splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def kafka(deploy):
    """The relay and the consumer reach the broker over SASL_SSL with their own principals, from an
    option file mounted from a Secret, and the broker's ACLs let only the relay write the topic."""
    objects = _kubernetes(deploy)
    secrets = {o["metadata"]["name"]: o.get("stringData", {}) for o in objects if o.get("kind") == "Secret"}
    users = [u for u in _documents(deploy / "kubernetes" / "examples" / "kafka-users.yaml") if u.get("kind") == "KafkaUser"]
    checked, problems, principals, topics, groups = 0, [], {}, set(), set()
    for name, pod, _ in _pods(objects):
        for container in pod.get("containers", []):
            env = {k: v.get("value") for k, v in _env(container).items()}
            if "IDEMPOST_KAFKA_BROKERS" not in env:
                continue
            checked += 1
            topics.add(env.get("IDEMPOST_TOPIC"))
            if not env["IDEMPOST_KAFKA_BROKERS"].endswith(f":{KAFKA}"):
                problems.append(f"{name}: brokers {env['IDEMPOST_KAFKA_BROKERS']} are not the SASL_SSL listener :{KAFKA}")
            if name == "idempost-consumer":
                groups.add(env.get("IDEMPOST_CONSUMER_GROUP") or env.get("IDEMPOST_CONSUMER_NAME") or DEFAULT_CONSUMER_GROUP)
            found = _mounted_secret_file(pod, container, env.get("IDEMPOST_KAFKA_OPTION_FILE") or "")
            if not found:
                problems.append(f"{name}: IDEMPOST_KAFKA_OPTION_FILE names no file of a mounted Secret")
                continue
            options = _options(secrets.get(found[0], {}).get(found[1], ""))
            if options.get("security.protocol") not in KAFKA_PROTOCOLS:
                problems.append(f"{name}: security.protocol {options.get('security.protocol')} is not one of {sorted(KAFKA_PROTOCOLS)}")
            ca = options.get("ssl.ca.location", "")
            if not _mounted_secret_file(pod, container, ca):
                problems.append(f"{name}: ssl.ca.location {ca!r} is no file of a mounted Secret")
            principals[name] = options.get("sasl.username")
    acls = {u["metadata"]["name"]: u["spec"]["authorization"]["acls"] for u in users}
    for user, rules in acls.items():
        for rule in rules:
            writes = {"Write", "All", "Create", "Alter", "Delete"} & set(rule["operations"])
            if rule["resource"]["type"] == "topic" and writes and user != principals.get("idempost-relay"):
                problems.append(f"KafkaUser {user} may {sorted(writes)} topic {rule['resource']['name']}: only the relay may write")
            if rule["resource"].get("patternType", "literal") != "literal" or rule["resource"].get("name") == "*":
                problems.append(f"KafkaUser {user}: an ACL on more than one named resource")

    def allows(user, kind, name, operation):
        return any(
            r["resource"]["type"] == kind and r["resource"]["name"] == name and operation in r["operations"]
            for r in acls.get(user, [])
        )

    for topic in topics:
        if not allows(principals.get("idempost-relay"), "topic", topic, "Write"):
            problems.append(f"the relay's principal may not write {topic}")
        if not allows(principals.get("idempost-consumer"), "topic", topic, "Read"):
            problems.append(f"the consumer's principal may not read {topic}")
    for group in groups:
        if not allows(principals.get("idempost-consumer"), "group", group, "Read"):
            problems.append(f"the consumer's principal may not use its group {group}")
    if len(set(principals.values())) != len(principals) or None in principals.values():
        problems.append(f"the relay and the consumer need principals of their own: {principals}")
    return checked, problems


def _peer_labels(selector):
    return None if selector is None else selector.get("matchLabels", {}) or selector.get("matchExpressions")


def egress(deploy):
    """Egress denied by default; each workload may reach only DNS, its database, the broker and
    the OTLP collector, each in a namespace of its own (no peer that is every destination)."""
    objects = _kubernetes(deploy)
    policies = [o for o in objects if o.get("kind") == "NetworkPolicy"]
    checked, problems = 0, []
    if not any(p["spec"]["podSelector"] == {} and "Egress" in p["spec"].get("policyTypes", []) and not p["spec"].get("egress") for p in policies):
        problems.append("no NetworkPolicy denies egress to every pod of the namespace")
    for name, _, labels in _pods(objects):
        checked += 1
        allowed = set()
        for policy in policies:
            if "Egress" not in policy["spec"].get("policyTypes", []) or not _selects(policy["spec"]["podSelector"], labels):
                continue
            for rule in policy["spec"].get("egress", []):
                peers = rule.get("to")
                if not peers or any(not _peer_labels(p.get("namespaceSelector")) and "ipBlock" not in p for p in peers):
                    problems.append(f"{policy['metadata']['name']}: an egress rule to any namespace or address")
                if not rule.get("ports"):
                    problems.append(f"{policy['metadata']['name']}: an egress rule to every port")
                allowed |= {port["port"] for port in rule.get("ports", [])}
        expected = EGRESS.get(labels.get("app.kubernetes.io/name"), set())
        if allowed != expected:
            problems.append(f"{name}: egress to ports {sorted(allowed)}, expected {sorted(expected)}")
    return checked, problems


def _selects(selector, labels):
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, values = labels.get(expression["key"]), expression.get("values", [])
        if {"In": value in values, "NotIn": value not in values, "Exists": value is not None, "DoesNotExist": value is None}[expression["operator"]] is False:
            return False
    return True


def ingress_namespaces(deploy):
    """A caller or operator label on a pod is trusted only from a namespace labelled
    idempost.example/clients=true: `namespaceSelector: {}` would admit such a pod from any
    namespace, where anyone who may create pods can set the label."""
    checked, problems = 0, []
    for policy in (o for o in _kubernetes(deploy) if o.get("kind") == "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                checked += 1
                where = f"{policy['metadata']['name']}: peer {peer}"
                namespaces = peer.get("namespaceSelector")
                if "ipBlock" in peer or namespaces is not None and not _peer_labels(namespaces):
                    problems.append(f"{where} admits every namespace or address")
                pod_labels = (peer.get("podSelector") or {}).get("matchLabels", {})
                if any(k.startswith("idempost.example/") for k in pod_labels):
                    if (namespaces or {}).get("matchLabels") != CLIENTS_LABEL:
                        problems.append(f"{where}: a caller or operator from a namespace not labelled {CLIENTS_LABEL}")
    return checked, problems


def _images(deploy):
    """(where, image reference) of every image the deployment files name."""
    for name, pod, _ in _pods(_kubernetes(deploy)):
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            yield f"kubernetes {name}", container["image"]
    for name, service in _compose(deploy)["services"].items():
        yield f"compose {name}", service["image"]
    text = re.sub(r"\\\n", " ", (deploy / "Dockerfile").read_text())
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.MULTILINE))
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.MULTILINE | re.IGNORECASE))
    for image in re.findall(r"^FROM\s+(?:--\S+\s+)*(\S+)", text, re.MULTILINE | re.IGNORECASE):
        if image not in stages:
            yield "Dockerfile", re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)


def images(deploy):
    """No `:latest` and no untagged image (both move under a deployment); Idempost's own images
    carry the workspace's version; a base image with a verified digest is pinned to it."""
    version = re.search(r'^version\s*=\s*"([^"]+)"', (deploy.parent / "Cargo.toml").read_text(), re.MULTILINE).group(1)
    checked, problems = 0, []
    for where, image in _images(deploy):
        checked += 1
        name, _, digest = image.partition("@")
        repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
        if tag in ("", "latest") and not digest:
            problems.append(f"{where}: {image} is not pinned to a tag or digest")
        if tag == "latest":
            problems.append(f"{where}: {image} uses :latest")
        if where.startswith("kubernetes") and repository.startswith("idempost-") and tag != version:
            problems.append(f"{where}: {image} is not tagged with the workspace version {version}")
        known = KNOWN_DIGESTS.get(name)
        if known and digest != known:
            problems.append(f"{where}: {image} is not pinned to its verified digest {known}")
    return checked, problems


def ignore_files(deploy):
    """Secrets, build output and history stay out of the image build context and out of git."""
    root = deploy.parent
    wanted = {
        ".dockerignore": ["deploy/secrets/", "target/", ".git/", "**/node_modules/"],
        ".gitignore": ["/deploy/secrets/"],
    }
    checked, problems = 0, []
    for file, patterns in wanted.items():
        path = root / file
        lines = path.read_text().splitlines() if path.exists() else []
        for pattern in patterns:
            checked += 1
            if pattern not in lines:
                problems.append(f"{file} does not ignore {pattern}")
    return checked, problems


RULES = {
    "secret-volumes": secret_volumes,
    "database-url-files": database_url_files,
    "kafka": kafka,
    "egress": egress,
    "ingress-namespaces": ingress_namespaces,
    "images": images,
    "ignore-files": ignore_files,
}


def report(deploy: pathlib.Path) -> dict:
    result = {}
    for name, rule in RULES.items():
        try:
            checked, problems = rule(deploy)
        except (OSError, KeyError, TypeError, ValueError) as error:
            checked, problems = 0, [f"cannot check: {type(error).__name__}: {error}"]
        result[name] = {"checked": checked, "problems": problems}
    return result
