// tests/integration/langchain_client.mjs - LangChain JS
// (`@langchain/openai` on `@langchain/core`) against kvd's HTTP front,
// for http_clients.sh. Jobs, output and errors: clients_run.mjs.
// Cases (mode):
//   chat, chatstream            ChatOpenAI (chat completions)
//   responses, responsesstream  ChatOpenAI with useResponsesApi
//   plain                       the OpenAI LLM (completions)
//   chatabort                   a chat stream aborted after its second
//                               chunk (an AbortSignal)
//   chatlogprobs                ChatOpenAI with logprobs: true,
//                               topLogprobs: 2: "logprobs" from
//                               response_metadata.logprobs.content
//   chatparse                   withStructuredOutput(zod schema, {method:
//                               "jsonSchema", strict: true}): "parsed",
//                               "valid"
//   chattools                   bindTools([a tool], {tool_choice: "any",
//                               strict: true}):
//                               AIMessage.tool_calls ("calls"), the tool
//                               run on them and its ToolMessage sent back
//                               (the model bound without tool_choice):
//                               the final text and finish_reason
// A refusal is {status, code, lc_error_code, class}: LangChain's error
// (it wraps the openai client's, keeping its status).
import { args, load, run, readThenAbort, lpList, Story, Weather, weather } from "./clients_run.mjs";

const { moduleDir, jobs } = args();
const lc = await load(moduleDir, "@langchain/openai");
const ChatOpenAI = lc.ChatOpenAI ?? lc.default?.ChatOpenAI;
const OpenAI = lc.OpenAI ?? lc.default?.OpenAI;
const { z } = await load(moduleDir, "zod");
const { tool } = await load(moduleDir, "@langchain/core/tools");
const { ToolMessage } = await load(moduleDir, "@langchain/core/messages");
const common = (a) => ({
	model: a.model, apiKey: a.apiKey, configuration: { baseURL: a.baseURL },
	temperature: a.temperature, maxRetries: 0, timeout: 60000,
});
const chatModel = (a, responses) => new ChatOpenAI({
	...common(a), maxTokens: a.maxTokens,
	// the Responses API has no seed nor stop
	...(responses ? { useResponsesApi: true } : { modelKwargs: { seed: a.seed }, stop: a.stop }),
});
const messages = (a) => typeof a.prompt === "string" ? [{ role: "user", content: a.prompt }]
						     : a.prompt;
// ChatOpenAI says finish_reason (chat) or the response's status
const finish = (m) => {
	const md = m.response_metadata ?? {};
	return md.finish_reason ?? (md.status === "incomplete" ? "length" :
				    md.status === "completed" ? "stop" : md.status);
};
const usage = (m) => ({ completion_tokens: m.usage_metadata?.output_tokens,
			prompt_tokens: m.usage_metadata?.input_tokens });

async function once(a, responses) {
	const m = await chatModel(a, responses).invoke(messages(a));
	return { text: m.content === "" ? "" : m.text ?? m.content, finish_reason: finish(m), ...usage(m) };
}

async function streamed(a, responses) {
	let all = null, chunks = 0;
	for await (const c of await chatModel(a, responses).stream(messages(a))) {
		chunks += c.text ? 1 : 0;
		all = all ? all.concat(c) : c;
	}
	return { text: all.text, finish_reason: finish(all), chunks, ...usage(all) };
}

const cases = {
	chat: (a) => once(a, false),
	chatstream: (a) => streamed(a, false),
	responses: (a) => once(a, true),
	responsesstream: (a) => streamed(a, true),
	async plain(a) {
		const llm = new OpenAI({ ...common(a), maxTokens: a.maxTokens, modelKwargs: { seed: a.seed } });
		const r = await llm.generate([a.prompt], { stop: a.stop });
		const g = r.generations[0][0];
		return { text: g.text, finish_reason: g.generationInfo?.finishReason,
			 completion_tokens: r.llmOutput?.tokenUsage?.completionTokens,
			 prompt_tokens: r.llmOutput?.tokenUsage?.promptTokens };
	},
	async chatlogprobs(a) {
		const m = await new ChatOpenAI({ ...common(a), maxTokens: a.maxTokens,
						 modelKwargs: { seed: a.seed }, logprobs: true, topLogprobs: 2 })
			.invoke(messages(a));
		return { text: m.text, finish_reason: finish(m), ...usage(m),
			 logprobs: lpList(m.response_metadata?.logprobs?.content, (t) => t.top_logprobs) };
	},
	async chatparse(a) {
		const schema = Story(z);
		const o = await chatModel(a, false)
			.withStructuredOutput(schema, { name: "story", method: "jsonSchema", strict: true })
			.invoke(messages(a));
		return { parsed: o, valid: schema.safeParse(o).success };
	},
	async chattools(a) {
		const params = Weather(z);
		const got = [];
		const getWeather = tool(async (input) => {
			got.push(input);
			return JSON.stringify(weather(input));
		}, { name: "get_weather", description: "The weather in a city", schema: params });
		const model = chatModel(a, false);
		const m1 = await model.bindTools([getWeather], { tool_choice: "any", strict: true }).invoke(messages(a));
		const calls = (m1.tool_calls ?? []).map((c) => ({
			name: c.name, arguments: c.args, valid: params.safeParse(c.args).success }));
		const out = { calls, finish_reason_1: finish(m1) };
		if (!calls.length)
			return out;
		const results = [];
		for (const c of m1.tool_calls)
			results.push(new ToolMessage({ tool_call_id: c.id,
						       content: await getWeather.invoke(c.args) }));
		const m2 = await model.bindTools([getWeather]).invoke([...messages(a), m1, ...results]);
		return { ...out, executed: got.length, text: m2.text, finish_reason: finish(m2),
			 calls_2: m2.tool_calls?.length ?? 0 };
	},
	async chatabort(a) {
		const ac = new AbortController();
		const s = await chatModel(a, false).stream(messages(a), { signal: ac.signal });
		return readThenAbort((async function* () {
			for await (const c of s)
				yield c.text;
		})(), 2, () => ac.abort());
	},
};

await run(jobs, cases, (e) => e?.status || e?.lc_error_code
	? { status: e.status ?? e.cause?.status, code: e.code ?? e.error?.code ?? null,
	    lc_error_code: e.lc_error_code ?? null }
	: null);
