"""Turns deploy/k8s into what Debian 12's podman (4.3) can `kube play`.

podman 4.3 plays Pods, Deployments, PersistentVolumeClaims and ConfigMaps
(as environment only); it has no Services, StatefulSets, Jobs, Secrets or
NetworkPolicies, and mounts only hostPath, emptyDir and PVC volumes. So:

  - the coordinator and the worker Deployments and the PVC are kept as
    written, except that
      * secret volumes become hostPath volumes of CERTS (the same files the
        Secrets hold: deploy/make-certs.sh's directory),
      * the coordinator keeps its own parameter shard (no StatefulSet of
        shards: its --noshard goes),
      * containerPorts go (podman 4.3 would publish each on the host; the
        pods reach each other on their network anyway),
      * pods reach the coordinator's Service name through hostAliases to
        COORDINATOR_IP (no Services), and the worker Deployment is written
        once per replica (podman 4.3 starts one pod per Deployment);
  - everything else is left out, and listed on stderr.

    python3 tests/k8s_podman.py K8S_DIR CERTS COORDINATOR_IP OUT_DIR
writes OUT_DIR/coordinator.yaml and OUT_DIR/workers.yaml.
"""
import copy
import os
import sys

import yaml

k8s_dir, certs, coordinator_ip, out_dir = sys.argv[1:5]
docs = []
for name in sorted(os.listdir(k8s_dir)):
    if name.endswith(".yaml"):
        with open(os.path.join(k8s_dir, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]


def podman_pod_spec(spec):
    # (A test cluster: the whole directory, CA key and every token
    # included, goes into each pod.)
    for v in spec.get("volumes", []):
        if "secret" in v:
            del v["secret"]
            v["hostPath"] = {"path": certs, "type": "Directory"}
    for c in spec["containers"]:
        c.pop("ports", None)  # podman 4.3 publishes them on the host
    spec["hostAliases"] = [{"ip": coordinator_ip,
                            "hostnames": ["tally-coordinator", "tally-server"]}]


coordinator, workers, skipped = [], [], []
for d in docs:
    kind, name = d.get("kind"), d.get("metadata", {}).get("name", "")
    if kind == "PersistentVolumeClaim" and name == "tally-coordinator-state":
        coordinator.append(d)
    elif kind == "Deployment" and name == "tally-coordinator":
        spec = d["spec"]["template"]["spec"]
        podman_pod_spec(spec)
        for c in spec["containers"]:
            c["args"] = [a for a in c.get("args", []) if a != "--noshard"]
        coordinator.append(d)
    elif kind == "Deployment" and name == "tally-worker":
        podman_pod_spec(d["spec"]["template"]["spec"])
        for i in range(d["spec"].get("replicas", 1)):
            w = copy.deepcopy(d)
            w["metadata"]["name"] = f"tally-worker-{i}"
            w["spec"]["replicas"] = 1
            workers.append(w)
    else:
        skipped.append(f"{kind}/{name}")

class Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # no anchors: podman reads plain YAML
        return True


if not coordinator or not workers:
    sys.exit("no coordinator or worker Deployment in " + k8s_dir)
with open(os.path.join(out_dir, "coordinator.yaml"), "w") as f:
    yaml.dump_all(coordinator, f, Dumper=Dumper, sort_keys=False)
with open(os.path.join(out_dir, "workers.yaml"), "w") as f:
    yaml.dump_all(workers, f, Dumper=Dumper, sort_keys=False)
print("not played (podman 4.3 has no such kind, or the check submits it): " + ", ".join(skipped), file=sys.stderr)
