// tests/integration/langchain_client.mjs - LangChain JS
// (`@langchain/openai` on `@langchain/core`) against kvd's HTTP front,
// for http_clients.sh. Jobs, output and errors: clients_run.mjs.
// Cases (mode):
//   chat, chatstream            ChatOpenAI (chat completions)
//   responses, responsesstream  ChatOpenAI with useResponsesApi
//   plain                       the OpenAI LLM (completions)
//   chatabort                   a chat stream aborted after its second
//                               chunk (an AbortSignal)
// A refusal is {status, code, lc_error_code, class}: LangChain's error
// (it wraps the openai client's, keeping its status).
import { args, load, run, readThenAbort } from "./clients_run.mjs";

const { moduleDir, jobs } = args();
const lc = await load(moduleDir, "@langchain/openai");
const ChatOpenAI = lc.ChatOpenAI ?? lc.default?.ChatOpenAI;
const OpenAI = lc.OpenAI ?? lc.default?.OpenAI;
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
