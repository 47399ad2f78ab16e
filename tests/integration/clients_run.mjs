// tests/integration/clients_run.mjs - what the npm client scripts share
// (openai_client.mjs, aisdk_client.mjs, langchain_client.mjs): the jobs,
// loading the client from the test's npm cache, running each job's case
// and printing one JSON line per job.
//
//   node CLIENT.mjs MODULE_DIR BASE_URL MODEL < JOBS
//     JOBS: one JSON object a line, {id?, key, mode, prompt, max_tokens,
//     temperature, seed, stop?}; one answer line per job, in order, as
//     soon as it is done (http_clients.sh keeps one node per client and
//     asks it through a FIFO: node starts once - seconds on a loaded
//     machine - not once per case)
//   node CLIENT.mjs MODULE_DIR BASE_URL KEY MODEL MODE PROMPT_JSON MAX_TOKENS TEMPERATURE SEED [STOP_JSON]
//     one job (http_openai.sh's form)
//
// A job's prompt is a string, an array of token ids (completions) or an
// array of {role, content} messages. A case is one async function of the
// job in the script's table of cases, named by its mode; it returns
// {text, finish_reason ("stop" | "length"), completion_tokens,
// prompt_tokens, chunks?, ...}. A refusal is {status, code, class} (the
// client's own exception type); anything else {exception}.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

function job(j, baseURL) {
	const stop = j.stop && j.stop.length ? j.stop : undefined;
	return { id: j.id, apiKey: j.key, baseURL, model: j.model, mode: j.mode, prompt: j.prompt,
		 maxTokens: Number(j.max_tokens), temperature: Number(j.temperature),
		 seed: Number(j.seed), stop };
}

// {moduleDir, jobs}: jobs() yields the jobs (the one in the arguments,
// or stdin's lines as they come).
export function args() {
	const argv = process.argv.slice(2);
	const [moduleDir, baseURL] = argv;
	if (argv.length > 3) {
		const [, , key, model, mode, promptJson, max_tokens, temperature, seed, stopJson] = argv;
		const one = job({ key, model, mode, prompt: JSON.parse(promptJson), max_tokens,
				  temperature, seed, stop: stopJson ? JSON.parse(stopJson) : null }, baseURL);
		return { moduleDir, jobs: async function* () { yield one; } };
	}
	return { moduleDir, jobs: async function* () {
		for await (const l of createInterface({ input: process.stdin }))
			if (l.trim())
				yield job({ model: argv[2], ...JSON.parse(l) }, baseURL);
	} };
}

// The module `name` as installed under moduleDir (ESM or CommonJS).
export async function load(moduleDir, name) {
	const req = createRequire(moduleDir + "/");
	return import(pathToFileURL(req.resolve(name)).href);
}

// Each job's case; errorOf(e) says what a refusal was (or null).
export async function run(jobs, cases, errorOf) {
	let failed = false;
	for await (const a of jobs()) {
		let out;
		try {
			if (!cases[a.mode])
				throw new Error(`no case ${a.mode}`);
			out = await cases[a.mode](a);
		} catch (e) {
			const r = errorOf(e);
			failed ||= !r;
			out = r ? { ...r, class: e.constructor.name }
				: { exception: String(e), class: e?.constructor?.name };
		}
		console.log(JSON.stringify(a.id === undefined ? out : { id: a.id, ...out }));
	}
	process.exitCode = failed ? 2 : 0;
}

// Read a stream's text pieces until `after` of them came, then abort
// (abort()); the answer says how many came and that it was aborted.
export async function readThenAbort(pieces, after, abort) {
	let chunks = 0, text = "";
	try {
		for await (const p of pieces) {
			if (!p)
				continue;
			text += p;
			if (++chunks >= after) {
				abort();
				break;
			}
		}
	} catch (e) {
		if (!String(e?.name).includes("Abort") && !String(e).includes("abort"))
			throw e;
	}
	return { aborted: true, chunks, text };
}

// A logprobs list as every client script answers it: [{token, logprob,
// top: [[token, logprob], ...]}], from the OpenAI chat shape ({token,
// logprob, top_logprobs: [{token, logprob}]}); topOf(entry) is where the
// client keeps the alternatives.
export function lpList(content, topOf) {
	if (!Array.isArray(content))
		return null;
	return content.map((t) => ({ token: t.token, logprob: t.logprob,
				     top: (topOf(t) ?? []).map((x) => [x.token, x.logprob]) }));
}

// The schemas the structured-output and tool cases share (z: the zod
// module of the test's npm cache): small and bounded (enums, a boolean,
// an integer, every key required, no other keys), so that an answer the
// grammar shapes ends well within max_tokens on the test model. zod's
// .int() writes the safe-integer minimum and maximum (kvd holds them by
// a digit bound).
export const Story = (z) => z.object({ mood: z.enum(["happy", "sad"]), ending: z.boolean(),
				       stars: z.number().int() });
export const Weather = (z) => z.object({ city: z.enum(["Paris", "Rome"]),
					unit: z.enum(["c", "f"]) });
// the tool itself: what get_weather answers for its arguments
export const weather = (args) => ({ city: args?.city, temperature: 21, unit: args?.unit });
