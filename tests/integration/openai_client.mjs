// tests/integration/openai_client.mjs - the official `openai` npm client
// against kvd's HTTP front, for http_openai.sh (openai@4) and
// http_clients.sh (the current major). Arguments, output and errors:
// clients_run.mjs (jobs on stdin, or one in the arguments). Cases:
//   plain, stream            completions (PROMPT_JSON a string or ids)
//   chat, chatstream         chat completions (PROMPT_JSON messages); the
//                            answer also has "role" and "object"
//   responses, responsesstream  client.responses.create (PROMPT_JSON a
//                            string or messages as input items); also
//                            "status", "object" and "events" (streamed)
//   chatabort                a chat stream the client aborts after its
//                            second chunk
//   chatn, chatnstream       chat completions with n: 3: "texts" and
//                            "finish_reasons" by choice index
//   chatlogprobs             chat with logprobs: true, top_logprobs: 2:
//                            also "logprobs" (clients_run.mjs' lpList)
//   chatjson                 response_format json_object: also "json",
//                            the content parsed (null when it is not JSON)
//   chatparse                chat.completions.parse with zodResponseFormat
//                            (json_schema, strict): "parsed", and "valid"
//                            (the zod schema's safeParse of it)
//   chattools, chattoolsauto a tool call round trip with a zodFunction
//                            tool (strict): tool_choice "required" (or the
//                            default, "auto": create, as parse throws on a
//                            text answer cut at max_tokens), parse's
//                            parsed_arguments, then the tool's result as a role "tool"
//                            message and the final answer: "calls" (name,
//                            arguments, valid by the zod schema), then
//                            text and finish_reason of the second request
// A refusal is {status, code, type, class}: class is the client's
// exception (AuthenticationError for 401, BadRequestError, ...).
import { args, load, run, readThenAbort, lpList, Story, Weather, weather } from "./clients_run.mjs";

const { moduleDir, jobs } = args();
const mod = await load(moduleDir, "openai");
// zod and the SDK's zod helpers, loaded by the cases that use them
// (http_openai.sh's openai@4 cache has no zod)
const zod = async () => ({ ...await load(moduleDir, "zod"),
			   ...await load(moduleDir, "openai/helpers/zod") });
const OpenAI = mod.default?.OpenAI ?? mod.OpenAI ?? mod.default;
const client = (a) => new OpenAI({ baseURL: a.baseURL, apiKey: a.apiKey, maxRetries: 0,
				     timeout: 60000 });
const sampling = (a) => ({ model: a.model, temperature: a.temperature, seed: a.seed });
const cmpl = (a) => ({ ...sampling(a), prompt: a.prompt, max_tokens: a.maxTokens, stop: a.stop });
const chat = (a) => ({ ...sampling(a), messages: a.prompt, max_tokens: a.maxTokens, stop: a.stop });
// the Responses API has no seed nor stop (kvd's seed is drawn: greedy only)
const resp = (a) => ({ model: a.model, input: a.prompt, max_output_tokens: a.maxTokens,
		       temperature: a.temperature });
const respFinish = (r) => r.status === "incomplete" ? "length" : "stop";

const cases = {
	async plain(a) {
		const r = await client(a).completions.create(cmpl(a));
		return { text: r.choices[0].text, finish_reason: r.choices[0].finish_reason,
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async stream(a) {
		const s = await client(a).completions.create({ ...cmpl(a), stream: true });
		let text = "", finish = null, usage = null, chunks = 0;
		for await (const c of s) {
			chunks++;
			text += c.choices[0]?.text ?? "";
			finish = c.choices[0]?.finish_reason ?? finish;
			usage = c.usage ?? usage;
		}
		return { text, finish_reason: finish, chunks,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async chat(a) {
		const r = await client(a).chat.completions.create(chat(a));
		const m = r.choices[0].message;
		return { text: m.content, role: m.role, object: r.object,
			 finish_reason: r.choices[0].finish_reason,
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async chatstream(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), stream: true });
		let text = "", finish = null, usage = null, chunks = 0, role = null, object = null;
		for await (const c of s) {
			chunks++;
			object = c.object;
			const d = c.choices[0]?.delta ?? {};
			role = role ?? d.role ?? null;
			text += d.content ?? "";
			finish = c.choices[0]?.finish_reason ?? finish;
			usage = c.usage ?? usage;
		}
		return { text, finish_reason: finish, chunks, role, object,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async responses(a) {
		const r = await client(a).responses.create(resp(a));
		return { text: r.output_text, finish_reason: respFinish(r), status: r.status,
			 object: r.object, completion_tokens: r.usage.output_tokens,
			 prompt_tokens: r.usage.input_tokens };
	},
	async responsesstream(a) {
		const s = await client(a).responses.create({ ...resp(a), stream: true });
		let text = "", done = null, chunks = 0;
		const events = [];
		for await (const e of s) {
			if (!events.includes(e.type))
				events.push(e.type);
			if (e.type === "response.output_text.delta") {
				chunks++;
				text += e.delta;
			}
			if (e.type === "response.completed" || e.type === "response.incomplete")
				done = e.response;
		}
		return { text, finish_reason: done && respFinish(done), status: done?.status,
			 chunks, events, completion_tokens: done?.usage.output_tokens,
			 prompt_tokens: done?.usage.input_tokens };
	},
	async chatn(a) {
		const r = await client(a).chat.completions.create({ ...chat(a), n: 3 });
		return { texts: r.choices.map((c) => c.message.content),
			 index: r.choices.map((c) => c.index),
			 finish_reasons: r.choices.map((c) => c.finish_reason),
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async chatnstream(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), n: 3, stream: true });
		const texts = ["", "", ""], finish = [null, null, null];
		let usage = null, chunks = 0;
		for await (const c of s) {
			chunks++;
			for (const ch of c.choices) {
				if (!(ch.index >= 0 && ch.index < 3))
					throw new Error(`a chunk names choice ${ch.index}`);
				texts[ch.index] += ch.delta?.content ?? "";
				finish[ch.index] = ch.finish_reason ?? finish[ch.index];
			}
			usage = c.usage ?? usage;
		}
		return { texts, finish_reasons: finish, chunks,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async chatabort(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), stream: true });
		return readThenAbort((async function* () {
			for await (const c of s)
				yield c.choices[0]?.delta?.content;
		})(), 2, () => s.controller.abort());
	},
	async chatlogprobs(a) {
		const r = await client(a).chat.completions.create({ ...chat(a), logprobs: true,
								    top_logprobs: 2 });
		const c = r.choices[0];
		return { text: c.message.content, finish_reason: c.finish_reason,
			 completion_tokens: r.usage.completion_tokens,
			 logprobs: lpList(c.logprobs?.content, (t) => t.top_logprobs) };
	},
	async chatjson(a) {
		const r = await client(a).chat.completions.create({
			...chat(a), response_format: { type: "json_object" } });
		const c = r.choices[0];
		let json = null;
		try {
			json = JSON.parse(c.message.content);
		} catch { /* null: not JSON */ }
		return { text: c.message.content, finish_reason: c.finish_reason, json,
			 completion_tokens: r.usage.completion_tokens };
	},
	async chatparse(a) {
		const { z, zodResponseFormat } = await zod();
		const schema = Story(z);
		const r = await client(a).chat.completions.parse({
			...chat(a), response_format: zodResponseFormat(schema, "story") });
		const c = r.choices[0];
		return { text: c.message.content, finish_reason: c.finish_reason,
			 parsed: c.message.parsed ?? null,
			 valid: schema.safeParse(c.message.parsed).success,
			 completion_tokens: r.usage.completion_tokens };
	},
	chattools: (a) => toolTrip(a, "required"),
	chattoolsauto: (a) => toolTrip(a, undefined),
};

// The round trip: a call with zodFunction's tool (parse gives each call's
// parsed_arguments), the tool run on them, its result sent back.
async function toolTrip(a, toolChoice) {
	const { z, zodFunction } = await zod();
	const c = client(a);
	const params = Weather(z);
	const tools = [zodFunction({ name: "get_weather", parameters: params,
				     description: "The weather in a city" })];
	// parse() throws when the answer ran into max_tokens: "auto" may
	// well be text that long, so it is asked with create()
	const r1 = toolChoice ? await c.chat.completions.parse({ ...chat(a), tools, tool_choice: toolChoice })
			      : await c.chat.completions.create({ ...chat(a), tools });
	const m = r1.choices[0].message;
	const argsOf = (t) => t.function.parsed_arguments ?? JSON.parse(t.function.arguments);
	const calls = (m.tool_calls ?? []).map((t) => ({
		name: t.function.name, arguments: argsOf(t), valid: params.safeParse(argsOf(t)).success }));
	const out = { finish_reason_1: r1.choices[0].finish_reason, text_1: m.content, calls };
	if (!calls.length)
		return out;
	const r2 = await c.chat.completions.create({
		...chat(a), tools,
		messages: [...a.prompt, m, ...m.tool_calls.map((t) => ({
			role: "tool", tool_call_id: t.id,
			content: JSON.stringify(weather(argsOf(t))) }))] });
	return { ...out, text: r2.choices[0].message.content,
		 finish_reason: r2.choices[0].finish_reason,
		 calls_2: r2.choices[0].message.tool_calls?.length ?? 0,
		 prompt_tokens_2: r2.usage.prompt_tokens, prompt_tokens_1: r1.usage.prompt_tokens };
}

await run(jobs, cases, (e) => e instanceof OpenAI.APIError
	? { status: e.status, code: e.code ?? e.error?.code, type: e.type ?? e.error?.type }
	: null);
