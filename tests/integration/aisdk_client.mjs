// tests/integration/aisdk_client.mjs - the Vercel AI SDK (`ai` and
// `@ai-sdk/openai`) against kvd's HTTP front, for http_clients.sh.
// Jobs, output and errors: clients_run.mjs. Cases (mode):
//   responses, responsesstream  the default provider, openai(model):
//                               POST /v1/responses
//   chat, chatstream            openai.chat(model)
//   plain, stream               openai.completion(model)
//   responsesabort              a /v1/responses stream aborted after
//                               its second piece
//   chatlogprobs                openai.chat with providerOptions
//                               {openai: {logprobs: 2}}: "logprobs" from
//                               providerMetadata.openai.logprobs
//   chatparse                   generateObject with a zod schema (the
//                               chat model's json_schema response_format):
//                               "parsed" (the object) and "valid"
//   chattools                   generateText with a tool (inputSchema
//                               zod, strict, execute), toolChoice "required",
//                               stopWhen stepCountIs(2) and prepareStep
//                               making step 2 toolChoice "none": "calls"
//                               (what execute got), "tool_result_sent"
//                               (step 2's request carries the result),
//                               the final text and finish_reason
// A refusal is {status, code, class}: APICallError with its statusCode.
import { args, load, run, readThenAbort, lpList, Story, Weather, weather } from "./clients_run.mjs";

globalThis.AI_SDK_LOG_WARNINGS = false;   // stderr stays the test's
const { moduleDir, jobs } = args();
const { generateText, streamText, generateObject, tool, stepCountIs, APICallError } =
	await load(moduleDir, "ai");
const { createOpenAI } = await load(moduleDir, "@ai-sdk/openai");
const { z } = await load(moduleDir, "zod");
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
	async chatlogprobs(a) {
		const r = await generateText(call(a, "chat", { providerOptions: { openai: { logprobs: 2 } } }));
		return { text: r.text, finish_reason: finish(r.finishReason),
			 completion_tokens: r.usage.outputTokens,
			 logprobs: lpList(r.providerMetadata?.openai?.logprobs, (t) => t.top_logprobs) };
	},
	async chatparse(a) {
		const schema = Story(z);
		const { prompt, messages, ...rest } = call(a, "chat");
		const r = await generateObject({ ...rest, messages: messages ?? [{ role: "user", content: prompt }],
						 schema, schemaName: "story" });
		return { parsed: r.object, valid: schema.safeParse(r.object).success,
			 finish_reason: finish(r.finishReason), completion_tokens: r.usage.outputTokens };
	},
	async chattools(a) {
		const calls = [];
		const params = Weather(z);
		const r = await generateText(call(a, "chat", {
			tools: { get_weather: tool({ description: "The weather in a city", inputSchema: params, strict: true,
						     execute: async (input) => {
							     calls.push({ name: "get_weather", arguments: input,
									  valid: params.safeParse(input).success });
							     return weather(input);
						     } }) },
			toolChoice: "required", stopWhen: stepCountIs(2),
			include: { requestBody: true },   // v7 keeps it only when asked
			prepareStep: ({ stepNumber }) => stepNumber === 1 ? { toolChoice: "none" } : undefined,
		}));
		const body2 = r.steps[1]?.request?.body;
		const sent = (typeof body2 === "string" ? JSON.parse(body2) : body2)?.messages ?? [];
		return { calls, steps: r.steps.length,
			 finish_reason_1: finish(r.steps[0]?.finishReason),
			 tool_result_sent: sent.some((m) => m.role === "tool" &&
				JSON.stringify(JSON.parse(m.content)) === JSON.stringify(weather(calls[0]?.arguments))),
			 text: r.text, finish_reason: finish(r.finishReason) };
	},
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
