"""The host: one engine core, several front ends (``voicehost serve --frontends N``).

One serving process cannot feed a GPU: vLLM's output handling, the pipeline to PCM and the
encoding run on its one event loop and GIL (``docs/BENCHMARKS.md``, host capacity). So the host
runs as ``vllm serve --api-server-count N`` does (``launcher``):

- the parent binds the HTTP port once, binds the engine core's sockets for N clients
  (``bind_engine_zmq_listeners``), makes the host's folder, starts the engine core
  (``launch_core_engines``) and spawns N front ends, each running the entry its caller gave
  (the API's or a cluster worker's: this package imports neither);
- each front end is a whole serving process (its own event loop, GIL, SNAC codec and encoding
  pool) whose engine is an ``AsyncLLM`` client of the shared core: client ``i`` of ``N``
  (``frontend.CoreClient``), accepting on the inherited socket;
- the parent waits: SIGTERM or SIGINT is passed to every front end, each drains as one server
  does, and the engine core is shut down once they have exited; a front end that dies takes
  the host down (a supervisor restarts it whole), and so does the engine core, which no front
  end's client watches (``frontend.CORE_LOST_SIGNAL`` tells them first). Killed with SIGKILL,
  the parent's reaper (``voicehost.lifeline``) ends the engine core and the front ends die
  with their parent.

What is one per host, in the host's folder (``frontend.FrontEnd``): the streams admission
counts, in all and per API key, and the engine requests the rate meter measures against
(``board.HostBoard``, admission's ``voicehost.speech.board.Board``); the LoRA ids (``lora_ids``:
the core knows an adapter by its id alone), both tables of integers mapped into every front end
(``hostfile``); each front end's readiness, and the host's drain (told over the channel, and a
flag for a front end that starts after it); the metrics (Prometheus' multiprocess mode: any
front end's ``/metrics`` sums them all). Elsewhere, but one per host too: the clone-job runner
(front end 0 runs it; the others queue into the same jobs folder, which it polls); the audit
chain (its file lock); usage (each stream is counted by the front end that sends it, into the
one usage file).

The front ends speak to each other over the host's channel (``channel``): each listens on a
Unix socket in the host's folder, ``frontend-<i>.sock``, and a message is a question and its
answer on a connection of their own, each a frame of 4 bytes of length and a JSON object
``{"topic", "body"}`` (the answer ``{"body"}`` or ``{"error"}``). A front end that has gone is
not listening (``PeerGone``, at once); one that does not answer within 2 s is ``PeerSilent``.
A serving process opens its end before it serves a request and closes it as it ends; each part
of it that the others may ask about registers a handler for its topics (``HostChannel.on``): a
front end drained tells the others (``frontend.DRAIN_TOPIC``), and the WebRTC sessions
ask each other: the host's front ends share the port, so a session's ``PATCH`` or
``DELETE`` may reach one that does not hold it, which asks the others who holds it (with the
caller's key: another key's session is answered as none) and hands the request to the holder
(``voicehost.api.webrtc.PeerSessions``).
"""
