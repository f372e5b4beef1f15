"""LLM server adapters: OpenAI-mode chat, managed-mode token servers, and atroposlib's servers.

Parsing is pure (``wire``, ``chat_wire``, ``token_wire``); I/O is one shared transport
(``transport``, over trajcore's own HTTP/1.1 client in ``adapters.http1``, chosen by
measurement -- see its docstring). The adapters
(``chat``, ``tokens``, ``atropos``) are thin compositions of the two.
"""
