"""The token ledger: a trajectory's tokens as the model saw and sampled them, for training.

RL on a multi-turn agent trains on one token sequence per trajectory. If that sequence is built
by re-tokenizing the finished conversation, it drifts from what the model actually sampled: the
separator a template puts after an assistant turn goes missing or doubles, think blocks that the
template strips from earlier turns vanish, an end-of-sequence token appears or not. The trainer
then scores tokens the model never produced. The ledger avoids this by never re-encoding:

- A ledger is a list of **segments**. A *prompt* segment is the first rendered prompt; a
  *completion* segment holds the ids and logprobs the server sampled, verbatim; an *environment*
  segment holds the template's tokens for what came back (tool results, a user nudge) plus the
  next generation prompt. The ledger's ids are the concatenation, and are exactly what the next
  request sends as its prompt (``prompt_ids``).
- **Masks and inference logprobs are derived**, never stored (``export``): masks are ``-100`` on
  prompt and environment tokens and the token id itself on completion tokens; inference logprobs
  are the sampled logprob on completion tokens and ``1.0`` elsewhere (Atropos's convention for
  masked positions: an impossible log-probability that is easy to spot).
- **Bridging without re-encoding** (``ChatTemplate.environment_ids``): the tokens that follow an
  assistant turn are learnt by rendering a small fixed *stand-in* conversation (one user line,
  one assistant turn calling the same tool call ids) with and without the new messages, and
  keeping the difference. When the template rewrites that stand-in turn once more messages follow
  (Qwen3 drops the think block of a turn before the latest user query), the bridge is instead
  the tail shared by two stand-ins whose replies differ in their last character, which is the
  end-of-turn followed by the new messages. In front of that goes whatever part of the
  template's end-of-turn the sampled ids lack (Qwen's ``<|im_end|>`` may be sampled while its
  ``\\n`` never is; a server may drop the end-of-sequence id). The render calls see only the
  stand-in and the new messages, so a turn costs the same at turn 8 as at turn 800.
- **Drift is a metric, not an exception** (``measure_drift``): comparing the ledger with a full
  re-render of the conversation reports where they first differ and how many tokens differ on
  each side. Drift is expected with templates that rewrite history (Qwen3 strips earlier think
  blocks); the ledger is what the model saw, and it wins.
- **Truncation is counted in tokens** and reported (``Truncation``): the head is kept, the tail
  cut, and the report says how many prompt, completion and environment tokens were lost.
- **OpenAI mode** (``ChatTemplate.rerender``): when the server did the templating, the ledger is
  rebuilt by re-rendering the messages; it is marked ``token_exact=False`` and has no logprobs.

This package is pure. Rendering is injected as a ``ChatRenderer`` (the ``Tokenizer`` port fits it),
so the domain decides what to render and the adapter does the tokenizer's work.
"""
