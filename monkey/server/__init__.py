"""`monkey server`: the HTTPS API of a main node, beside its core (Starlette + uvicorn).

One more client of the ``Monkey`` facade: the core stays the only writer of job state.
``files``: where its certificate, key, pid, lock and log live; ``tls``: the self-signed
certificate; ``auth``: users' tokens and the rate limit; ``calls``: the facade methods the
API allows and who may call them; ``app``: the routes; ``service``: running it (foreground
or detached, like the core)."""
