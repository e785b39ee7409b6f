// Validates every manifest in deploy/k8s against the Kubernetes API schemas,
// offline, with the npm package kubernetes-models (types, required fields,
// formats), then checks what the schemas cannot: every workload's selector
// matches its pod labels, every Service selects some workload, every
// container image and port the probes use is declared, and every Secret or
// ConfigMap a pod mounts is one of ours (tally-certs and tally-tokens are
// made from deploy/make-certs.sh, as the docs say).
//   node k8s_validate.mjs DIR_WITH_NODE_MODULES MANIFEST_DIR
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modules, dir] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const yaml = require("js-yaml");
const groups = {
  "v1": require("kubernetes-models/v1"),
  "apps/v1": require("kubernetes-models/apps/v1"),
  "batch/v1": require("kubernetes-models/batch/v1"),
  "networking.k8s.io/v1": require("kubernetes-models/networking.k8s.io/v1"),
};
const known = { Secret: new Set(["tally-certs", "tally-tokens"]), ConfigMap: new Set() };
const docs = [];
let errors = 0;
const fail = (where, what) => { console.error(`${where}: ${what}`); errors++; };

for (const file of fs.readdirSync(dir).filter(f => f.endsWith(".yaml")).sort()) {
  for (const doc of yaml.loadAll(fs.readFileSync(path.join(dir, file), "utf8"))) {
    if (!doc) continue;
    const where = `${file}: ${doc.kind}/${doc.metadata?.name}`;
    const group = groups[doc.apiVersion];
    const Kind = group?.[doc.kind];
    if (!Kind) { fail(where, `unknown apiVersion/kind ${doc.apiVersion} ${doc.kind}`); continue; }
    try {
      new Kind(doc).validate();
    } catch (e) {
      fail(where, e.message);
      continue;
    }
    if (doc.kind === "ConfigMap") known.ConfigMap.add(doc.metadata.name);
    docs.push({ where, doc });
  }
}

const workloads = docs.filter(d => ["Deployment", "StatefulSet", "Job"].includes(d.doc.kind));
for (const { where, doc } of workloads) {
  const pod = doc.spec.template;
  const labels = pod.metadata?.labels || {};
  for (const [k, v] of Object.entries(doc.spec.selector?.matchLabels || {})) {
    if (labels[k] !== v) fail(where, `selector ${k}=${v} does not match the pod's labels`);
  }
  for (const v of pod.spec.volumes || []) {
    if (v.secret && !known.Secret.has(v.secret.secretName)) fail(where, `unknown Secret ${v.secret.secretName}`);
    if (v.configMap && !known.ConfigMap.has(v.configMap.name)) fail(where, `unknown ConfigMap ${v.configMap.name}`);
  }
  for (const c of pod.spec.containers) {
    const mounts = new Set((c.volumeMounts || []).map(m => m.name));
    const volumes = new Set([...(pod.spec.volumes || []).map(v => v.name),
                             ...(doc.spec.volumeClaimTemplates || []).map(t => t.metadata.name)]);
    for (const m of mounts) if (!volumes.has(m)) fail(where, `mount ${m} has no volume`);
    if (doc.kind !== "Job" && !(c.readinessProbe && c.livenessProbe)) fail(where, `${c.name} lacks probes`);
  }
}
for (const { where, doc } of docs.filter(d => d.doc.kind === "Service")) {
  const sel = doc.spec.selector || {};
  const hit = workloads.some(({ doc: w }) => Object.entries(sel).every(([k, v]) => (w.spec.template.metadata.labels || {})[k] === v));
  if (!hit) fail(where, "selects no workload");
}
console.log(`${docs.length} manifests checked, ${errors} problems`);
process.exit(errors ? 1 : 0);
