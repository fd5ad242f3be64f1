"""Cost of the body checks (server.limits) against parsing the same body, same run."""
import asyncio, json, time
from server.limits import check_request_json, check_metadata

class Req:
    method = "POST"
    def __init__(self, raw): self.raw = raw; self._j = None
    async def body(self): return self.raw
    async def json(self):
        if self._j is None: self._j = json.loads(self.raw)
        return self._j

def best(f, k=5):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)

LOOP = asyncio.new_event_loop()
bodies = {
 "chat, 8 messages": {"model": "m", "messages": [{"role": "user", "content": "hello " * 50}] * 8, "max_tokens": 64},
 "chat, 200 messages + escapes": {"model": "m", "messages": [{"role": "user", "content": "héllo 🙂 " * 50}] * 200},
 "1M prompt token ids": {"prompt_token_ids": list(range(1_000_000))},
}
for name, b in bodies.items():
    raw = json.dumps(b).encode()
    parse = best(lambda: json.loads(raw))
    def check():
        r = Req(raw); r._j = json.loads(raw)
        LOOP.run_until_complete(check_request_json(r))
    total = best(check)
    print(f"{name:32s} {len(raw)/1e6:6.2f} MB  parse {parse*1e3:8.2f} ms  check {max(total-parse,0)*1e3:8.2f} ms  ratio {max(total-parse,0)/parse:5.2f}")
meta = {"task": "t", "answer": list(range(1000)), "nested": {"a": {"b": [1.5, None, "x"]}}}
print(f"metadata check (1000 ints): {best(lambda: check_metadata(meta))*1e3:.3f} ms")
raw = json.dumps({"prompt_token_ids": list(range(1_000_000))}).encode()
r = Req(raw); r._j = json.loads(raw)
print("1M ids, pre-parsed: check", best(lambda: LOOP.run_until_complete(check_request_json(r)))*1e3, "ms")
