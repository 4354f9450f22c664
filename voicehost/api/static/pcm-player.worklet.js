// The audio path's end: Float32 chunks posted by player.js, played in order as they come.
// It counts the samples it receives, plays and drops (a barge-in), and tells the page with the
// audio clock's time at the end of what it played, so the page can say what is heard now.

class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];
    this.offset = 0; // into queue[0]
    this.received = 0;
    this.played = 0;
    this.dropped = 0; // queued when cleared: sent, never played
    this.epoch = 0; // the page's count of resets: a report of an earlier one is ignored there
    this.blocks = 0;
    this.playedUntil = 0; // the audio clock (currentTime) at the end of the last block played
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.type === "samples") {
        this.queue.push(message.samples);
        this.received += message.samples.length;
        this.port.postMessage({ type: "received", received: this.received, epoch: this.epoch });
      } else if (message.type === "clear") {
        this.dropped += this.queued();
        this.queue = [];
        this.offset = 0;
        this.report();
      } else if (message.type === "reset") {
        this.queue = [];
        this.offset = 0;
        this.received = 0;
        this.played = 0;
        this.dropped = 0;
        this.epoch = message.epoch;
        this.report();
      }
    };
  }

  queued() {
    return this.queue.reduce((n, chunk) => n + chunk.length, 0) - this.offset;
  }

  report() {
    this.port.postMessage({
      type: "played",
      received: this.received,
      played: this.played,
      dropped: this.dropped,
      queued: this.queued(),
      time: this.playedUntil,
      epoch: this.epoch,
    });
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let filled = 0;
    while (filled < out.length && this.queue.length > 0) {
      const chunk = this.queue[0];
      const take = Math.min(out.length - filled, chunk.length - this.offset);
      out.set(chunk.subarray(this.offset, this.offset + take), filled);
      filled += take;
      this.offset += take;
      if (this.offset === chunk.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    out.fill(0, filled);
    for (let channel = 1; channel < outputs[0].length; channel++) outputs[0][channel].set(out);
    this.played += filled;
    this.playedUntil = currentTime + filled / sampleRate;
    if (filled > 0 && ++this.blocks % 8 === 0) this.report();
    if (filled > 0 && this.queue.length === 0) this.report();
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayer);
