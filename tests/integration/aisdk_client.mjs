// tests/integration/aisdk_client.mjs - the Vercel AI SDK (`ai` and
// `@ai-sdk/openai`) against kvd's HTTP front, for http_clients.sh.
// Jobs, output and errors: clients_run.mjs. Cases (mode):
//   responses, responsesstream  the default provider, openai(model):
//                               POST /v1/responses
//   chat, chatstream            openai.chat(model)
//   plain, stream               openai.completion(model)
//   responsesabort              a /v1/responses stream aborted after
//                               its second piece
// A refusal is {status, code, class}: APICallError with its statusCode.
import { args, load, run, readThenAbort } from "./clients_run.mjs";

globalThis.AI_SDK_LOG_WARNINGS = false;   // stderr stays the test's
const { moduleDir, jobs } = args();
const { generateText, streamText, APICallError } = await load(moduleDir, "ai");
const { createOpenAI } = await load(moduleDir, "@ai-sdk/openai");
const models = {
	responses: (p, a) => p(a.model),
	chat: (p, a) => p.chat(a.model),
	plain: (p, a) => p.completion(a.model),
};
const call = (a, model, extra) => ({
	model: models[model](createOpenAI({ baseURL: a.baseURL, apiKey: a.apiKey }), a),
	...(typeof a.prompt === "string" ? { prompt: a.prompt } : { messages: a.prompt }),
	maxOutputTokens: a.maxTokens, temperature: a.temperature,
	// the Responses API has no seed nor stop: the SDK would warn and drop them
	...(model === "responses" ? {} : { seed: a.seed, stopSequences: a.stop }),
	maxRetries: 0, ...extra,
});
// "stop" | "length" as OpenAI says them (the SDK's finishReason is a
// string, or {unified, raw} in later versions)
const finish = (f) => {
	const u = typeof f === "string" ? f : f?.unified ?? f?.type;
	return u === "length" ? "length" : u === "stop" ? "stop" : u;
};

async function once(a, model) {
	const r = await generateText(call(a, model));
	return { text: r.text, finish_reason: finish(r.finishReason),
		 completion_tokens: r.usage.outputTokens, prompt_tokens: r.usage.inputTokens };
}

async function streamed(a, model) {
	let error = null;
	const r = streamText(call(a, model, { onError: ({ error: e }) => { error = e; } }));
	let text = "", chunks = 0;
	for await (const p of r.textStream) {
		chunks++;
		text += p;
	}
	if (error)
		throw error;
	const usage = await r.usage;
	return { text, finish_reason: finish(await r.finishReason), chunks,
		 completion_tokens: usage.outputTokens, prompt_tokens: usage.inputTokens };
}

const cases = {
	responses: (a) => once(a, "responses"),
	responsesstream: (a) => streamed(a, "responses"),
	chat: (a) => once(a, "chat"),
	chatstream: (a) => streamed(a, "chat"),
	plain: (a) => once(a, "plain"),
	stream: (a) => streamed(a, "plain"),
	async responsesabort(a) {
		const ac = new AbortController();
		const r = streamText(call(a, "responses", { abortSignal: ac.signal, onError: () => {} }));
		return readThenAbort(r.textStream, 2, () => ac.abort());
	},
};

await run(jobs, cases, (e) => APICallError.isInstance(e)
	? { status: e.statusCode, code: safeCode(e.responseBody) }
	: null);

function safeCode(body) {
	try {
		return JSON.parse(body).error.code;
	} catch {
		return null;
	}
}
