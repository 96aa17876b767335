"""The official `openai` Python package against `drift serve` (run by app/tests/serve.rs).

usage: serve_openai.py BASE_URL API_KEY CHAT_MODEL IMAGE_MODEL
Exits non-zero with a message on the first failed check.
"""

import base64
import struct
import sys

import openai
from openai import OpenAI

base_url, api_key, chat_model, image_model = sys.argv[1:5]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
messages = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


def check(condition, what):
    if not condition:
        sys.exit(f"openai-python: FAILED: {what}")
    print(f"openai-python: ok: {what}", flush=True)


ids = [m.id for m in client.models.list()]
check(chat_model in ids and image_model in ids, f"models.list() lists {chat_model} and {image_model}: {ids}")

reply = client.chat.completions.create(model=chat_model, messages=messages, temperature=0, max_tokens=12, seed=1)
text = reply.choices[0].message.content
usage = reply.usage
check(reply.object == "chat.completion" and reply.model == chat_model, "a chat.completion object")
check(reply.choices[0].message.role == "assistant" and isinstance(text, str), "an assistant message")
check(reply.choices[0].finish_reason in ("stop", "length"), f"finish_reason {reply.choices[0].finish_reason}")
check(
    usage.prompt_tokens > 0
    and 0 < usage.completion_tokens <= 12
    and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
    f"usage {usage}",
)

stream = client.chat.completions.create(
    model=chat_model,
    messages=messages,
    temperature=0,
    max_tokens=12,
    seed=1,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, streamed_usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        streamed_usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        finish = choice.finish_reason or finish
check("".join(pieces) == text, f"streamed text {''.join(pieces)!r} equals the non-streamed {text!r}")
check(finish == reply.choices[0].finish_reason, "the stream's finish_reason")
check(streamed_usage is not None and streamed_usage.total_tokens == usage.total_tokens, "the stream's usage chunk")

stopped = client.chat.completions.create(
    model=chat_model, messages=messages, temperature=0, max_tokens=12, stop=[text[len(text) // 2]]
)
check(
    text.startswith(stopped.choices[0].message.content) and stopped.choices[0].finish_reason == "stop",
    "a stop sequence ends the reply early with finish_reason stop",
)

completion = client.completions.create(model=chat_model, prompt="Once upon a time", temperature=0, max_tokens=5)
check(completion.object == "text_completion" and isinstance(completion.choices[0].text, str), "completions.create")

images = client.images.generate(
    model=image_model,
    prompt="a red square",
    size="24x16",
    response_format="b64_json",
    extra_body={"steps": 2, "seed": 3, "scheduler": "euler", "negative_prompt": "blurry", "cfg_scale": 5},
)
png = base64.b64decode(images.data[0].b64_json)
width, height = struct.unpack(">II", png[16:24])
check(png[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (24, 16), f"images.generate gives a 24x16 PNG ({width}x{height})")

try:
    OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0).models.list()
    check(False, "a wrong key is refused")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "a wrong key raises AuthenticationError (401)")

for bad, what in [
    ({"model": "no-such-model"}, "an unknown model"),
    ({"model": chat_model, "temperature": 5}, "temperature 5"),
]:
    try:
        client.chat.completions.create(messages=messages, **bad)
        check(False, f"{what} is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body and e.body.get("message"), f"{what} raises BadRequestError (400)")

# A client that hangs up mid-stream: the server cancels that generation and keeps serving.
stream = client.chat.completions.create(model=chat_model, messages=messages, temperature=0, stream=True)
first = next(iter(stream))
stream.close()
check(first.object == "chat.completion.chunk", "the first chunk of a stream that is then abandoned")
after = client.chat.completions.create(model=chat_model, messages=messages, temperature=0, max_tokens=3)
check(after.choices[0].message.content is not None, "the server answers after a client hung up mid-stream")
print("openai-python: all checks passed")
