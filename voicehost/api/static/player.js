// Streaming playback: s16le mono PCM at 24 kHz, as the API sends it, into an AudioWorklet
// (pcm-player.worklet.js) that plays each chunk as soon as it arrives.

export const SAMPLE_RATE = 24000;

let context = null;
let loading = null;

// The page's one AudioContext, made on the first click (browsers start audio on a gesture).
async function audioContext() {
  if (context === null) {
    context = new AudioContext({ sampleRate: SAMPLE_RATE });
    loading = context.audioWorklet.addModule("/playground/pcm-player.worklet.js");
  }
  await loading;
  if (context.state !== "running") await context.resume();
  return context;
}

export class StreamPlayer {
  // onStats({received, played, queued}): what the worklet has received and played, in samples.
  constructor(onStats) {
    this.onStats = onStats;
    this.node = null;
    this.carry = null; // an odd byte left from the last chunk
    this.received = 0;
  }

  async open() {
    if (this.node) return;
    const ctx = await audioContext();
    this.node = new AudioWorkletNode(ctx, "pcm-player", { outputChannelCount: [1] });
    this.node.connect(ctx.destination);
    this.node.port.onmessage = (event) => {
      const message = event.data;
      if (message.received !== undefined) this.received = message.received;
      this.onStats(message);
    };
  }

  // A new utterance: counts from 0.
  reset() {
    this.carry = null;
    if (this.node) this.node.port.postMessage({ type: "reset" });
  }

  // Bytes of s16le PCM (any length: an odd byte waits for the next chunk); returns samples.
  push(bytes) {
    let data = new Uint8Array(bytes);
    if (this.carry !== null) {
      const joined = new Uint8Array(data.length + 1);
      joined[0] = this.carry;
      joined.set(data, 1);
      data = joined;
      this.carry = null;
    }
    if (data.length % 2 === 1) {
      this.carry = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    const count = data.length / 2;
    if (count === 0) return 0;
    const view = new DataView(data.buffer, data.byteOffset, data.length);
    const samples = new Float32Array(count);
    for (let i = 0; i < count; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    this.node.port.postMessage({ type: "samples", samples }, [samples.buffer]);
    return count;
  }

  // Barge-in: drop what is queued, at once.
  clear() {
    this.carry = null;
    if (this.node) this.node.port.postMessage({ type: "clear" });
  }
}
