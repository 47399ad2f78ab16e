// k8s_validate.mjs - validate Kubernetes objects offline (k8s_manifests.sh).
//
//   node k8s_validate.mjs NODE_MODULES MANIFESTS.yaml OUT.json
//
// Every object of the multi-document YAML is checked twice:
//   - against the Kubernetes OpenAPI schema of its kind (the npm package
//     kubernetes-models: required fields, types, enums, formats);
//   - strictly: every field must be one the API defines (the models of
//     @kubernetes/client-node, generated from the same OpenAPI document,
//     list each type's fields), as the API server's strict field
//     validation would; the OpenAPI schemas alone let a typo'd field pass.
// One TAP line per object and check ("ok - ..." / "not ok - ... WHY"); the
// objects go to OUT.json as one JSON array for the shell's own checks.
// Exit 0 when every object passed, 1 when one did not, 2 on bad usage.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [mods, manifests, out] = process.argv.slice(2);
if (!mods || !manifests || !out) {
	console.error("usage: node k8s_validate.mjs NODE_MODULES MANIFESTS.yaml OUT.json");
	process.exit(2);
}
const require = createRequire(path.join(mods, "noop.js"));
const YAML = require("yaml");
const models = await import(pathToFileURL(
	path.join(mods, "@kubernetes/client-node/dist/gen/models/all.js")).href);

// kubernetes-models' module of an apiVersion: v1 -> kubernetes-models/v1,
// apps/v1 -> kubernetes-models/apps/v1
function schemaClass(obj) {
	const mod = require(`kubernetes-models/${obj.apiVersion}`);
	const cls = mod[obj.kind];
	if (!cls)
		throw new Error(`no schema for ${obj.apiVersion} ${obj.kind}`);
	return cls;
}

// client-node's model of a kind: V1Deployment for apps/v1 Deployment
function modelName(obj) {
	const version = obj.apiVersion.split("/").pop();
	return version.charAt(0).toUpperCase() + version.slice(1) + obj.kind;
}

const ARRAY = /^Array<(.+)>$/;
const MAP = /^\{ \[key: string\]: (.+); \}$/;

// Every field of value under type, recursively: unknown ones into bad.
function strict(value, type, where, bad) {
	let m;
	if (value === null || value === undefined)
		return;
	if ((m = ARRAY.exec(type))) {
		if (Array.isArray(value))
			value.forEach((v, i) => strict(v, m[1], `${where}[${i}]`, bad));
		return;
	}
	if ((m = MAP.exec(type))) {
		if (typeof value === "object")
			for (const [k, v] of Object.entries(value))
				strict(v, m[1], `${where}.${k}`, bad);
		return;
	}
	const model = models[type];
	if (!model || !model.attributeTypeMap || typeof value !== "object")
		return; // a scalar, IntOrString, any: the schema check types it
	const fields = new Map(model.attributeTypeMap.map((a) => [a.baseName, a.type]));
	for (const [k, v] of Object.entries(value)) {
		if (!fields.has(k))
			bad.push(`${where}.${k} (not a field of ${type})`);
		else
			strict(v, fields.get(k), `${where}.${k}`, bad);
	}
}

const docs = YAML.parseAllDocuments(readFileSync(manifests, "utf8"));
const objs = [];
let failed = 0;
for (const doc of docs) {
	if (doc.errors.length) {
		console.log(`not ok - YAML: ${doc.errors[0].message}`);
		failed++;
		continue;
	}
	const obj = doc.toJSON();
	if (!obj)
		continue;
	objs.push(obj);
	const what = `${obj.kind} ${obj.metadata?.name}`;
	// kustomize wraps a Secret's base64 at 76 columns, which the API
	// server's decoder (Go's encoding/base64) skips; the schema's "byte"
	// format does not: check the data unwrapped
	const checked = structuredClone(obj);
	if (obj.kind === "Secret" && obj.data)
		for (const k of Object.keys(obj.data))
			checked.data[k] = String(obj.data[k]).replace(/\n/g, "");
	try {
		new (schemaClass(obj))(checked).validate();
		console.log(`ok - ${what}: valid against the ${obj.apiVersion} ${obj.kind} schema`);
	} catch (e) {
		console.log(`not ok - ${what}: ${String(e.message).split("\n")[0]}`);
		failed++;
	}
	const bad = [];
	const name = modelName(obj);
	if (!models[name]) {
		console.log(`not ok - ${what}: no model ${name} to check its fields against`);
		failed++;
		continue;
	}
	strict(obj, name, obj.kind, bad);
	if (bad.length) {
		console.log(`not ok - ${what}: unknown fields: ${bad.join(", ")}`);
		failed++;
	} else {
		console.log(`ok - ${what}: every field is one ${name} defines`);
	}
}
writeFileSync(out, JSON.stringify(objs));
process.exit(failed ? 1 : 0);
