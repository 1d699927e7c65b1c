#!/usr/bin/env bash
# The kind cluster's local registry: `pulumi up -s kind` builds the runtime image and pushes it to
# localhost:5001 (stacks/Pulumi.kind.yaml kubernetes.runtime_image.build), and the kind nodes pull it from
# there by digest, the way a real cluster pulls from its registry (docs/kubernetes.md, "Runtime image").
# Run once after `kind create cluster --config templates/kind-cluster.yaml`; running it again is harmless.
#   bash tools/kind-registry.sh [CLUSTER]      (default CLUSTER: ascend, the name in templates/kind-cluster.yaml)
#
# What it does, after kind's "local registry" guide (kind.sigs.k8s.io/docs/user/local-registry/):
#   1. a registry:2 container `kind-registry` published on 127.0.0.1:5001 (the address the build pushes to);
#   2. on every node, /etc/containerd/certs.d/localhost:5001/hosts.toml sending pulls of localhost:5001 to
#      http://kind-registry:5000 (inside a node, localhost is the node itself; node images of kind v0.27.0
#      and later read that directory);
#   3. the registry joined to the `kind` network, so the nodes resolve kind-registry;
#   4. the ConfigMap kube-public/local-registry-hosting that tools look for (KEP-1755).
set -euo pipefail
cluster="${1:-ascend}"
name=kind-registry
port=5001

if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null || true)" != true ]; then
  docker run -d --restart=always -p "127.0.0.1:${port}:5000" --network bridge --name "$name" registry:2
fi

dir="/etc/containerd/certs.d/localhost:${port}"
for node in $(kind get nodes --name "$cluster"); do
  docker exec "$node" mkdir -p "$dir"
  printf '[host."http://%s:5000"]\n' "$name" | docker exec -i "$node" cp /dev/stdin "$dir/hosts.toml"
done

if [ "$(docker inspect -f '{{json .NetworkSettings.Networks.kind}}' "$name")" = null ]; then
  docker network connect kind "$name"
fi

kubectl --context "kind-${cluster}" apply -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-registry-hosting
  namespace: kube-public
data:
  localRegistryHosting.v1: |
    host: "localhost:${port}"
    help: "https://kind.sigs.k8s.io/docs/user/local-registry/"
EOF
echo "registry localhost:${port} serves the nodes of kind cluster ${cluster}"
