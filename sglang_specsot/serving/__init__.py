"""Server-side SoT: SGLang's OpenAI chat route answering opted-in requests by Skeleton-of-Thought.

- `chat`: the hook on the chat route (host change "sot-chat-route") and one request's flow;
- `field`: the request's `specsot` field and the server default (SGLANG_SPECSOT_SOT_MODE);
- `backend`: the runner's generations through SGLang's TokenizerManager;
- `stream`: a streamed answer as server-sent events; `responses`: SGLang's OpenAI objects;
- `skeleton_constraint`: the custom logit processor that keeps a skeleton a numbered list.
"""
