/* openai_int.h - openai.c's readers that live in openai_tools.c (the
 * tools side of a chat body). Same contract as openai.c's readers:
 * 0, OPENAI_E_INVALID with err filled (param named), -ENOMEM. */
#pragma once

#include "net/wire/openai.h"

#include <jansson.h>

/* 400 invalid_request_error naming param, the message printf'd. */
int openai__bad(struct openai_error *err, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* 400 for a value kvd knows but cannot honour (code
 * unsupported_parameter, param `param`). */
int openai__unsupported(struct openai_error *err, const char *param,
			const char *what);
int openai__rd_tools(struct openai_req *q, const char *k, json_t *v,
		     struct openai_error *err);
int openai__rd_tool_choice(struct openai_req *q, const char *k, json_t *v,
			   struct openai_error *err);
/* messages[i].tool_calls into m (an assistant message). */
int openai__msg_calls(struct openai_msg *m, size_t i, json_t *v,
		      struct openai_error *err);
/* The checks across fields, once the body is read. */
int openai__tools_check(struct openai_req *q, struct openai_error *err);
void openai__tools_free(struct openai_req *q);
