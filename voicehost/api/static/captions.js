// Captions: the text being spoken, each timed word a span over it (the text between the words,
// its punctuation and spacing, kept as it was), the word heard now highlighted by the player's
// clock, and after a barge-in the words that were heard marked, and no later ones.
//
// Words come from the service's word events ({start, end, audio_start, audio_end, said}: a span
// of the text and seconds of the stream's audio). A word comes once its audio has been sent,
// which may be well before it is played: the clock, not its arrival, says when it is heard.
// The element is aria-live="off": a moving highlight is not read out.

const SLACK = 1e-3; // the service floors a word's times to the millisecond
// A word may come only after it has been heard (its end is known once the next word is heard,
// later still when the audio comes slower than it plays): the last word begun stays the one
// highlighted until the next begins, or for this long (ms) once its end is seen passed.
const LINGER_MS = 500;

export class Captions {
  // element: where the text goes; clock(): seconds of the stream the listener has heard.
  constructor(element, clock) {
    this.element = element;
    this.clock = clock;
    this.text = "";
    this.words = []; // in the order of their spans; a word of an earlier run has its `state`
    this.spans = [];
    this.current = -1;
    this.stoppedAt = null; // the clock at a barge-in
    this.ended = false; // no more words: following stops once the last has been heard
    this.frame = null;
  }

  // A new text (a new utterance, a new session): no words yet.
  start(text = "") {
    this.text = text;
    this.words = [];
    this.stoppedAt = null;
    this.ended = false;
    delete this.element.dataset.heard;
    delete this.element.dataset.stoppedAt;
    this.render();
    this.follow();
  }

  // More text sent (type as you go): the words' spans index into all of it. After a barge-in
  // the words so far keep their marks and the clock is followed again.
  append(piece) {
    this.text += piece;
    if (this.stoppedAt !== null) {
      this.freeze();
      this.stoppedAt = null;
      delete this.element.dataset.heard;
      delete this.element.dataset.stoppedAt;
    }
    this.render();
    this.follow();
  }

  // A word event of the stream.
  word(event) {
    const word = {
      start: event.start,
      end: event.end,
      from: event.audio_start,
      to: event.audio_end,
      said: event.said,
      state: null,
    };
    if (!(word.start >= 0 && word.end > word.start && word.end <= this.text.length)) return;
    let at = this.words.length;
    while (at > 0 && this.words[at - 1].start >= word.start) at -= 1;
    if (this.words[at] && this.words[at].start < word.end) return; // that span, again
    if (at > 0 && this.words[at - 1].end > word.start) return;
    this.words.splice(at, 0, word);
    this.render();
    if (this.stoppedAt !== null) this.mark();
  }

  // The stream has ended: its words are all here.
  end() {
    this.ended = true;
  }

  // Barge-in: what the listener heard is what the clock had reached; the words of this run
  // that ended by then are marked heard, the rest (and any of it that come later) not.
  stop() {
    if (this.stoppedAt === null) this.stoppedAt = this.clock();
    this.mark();
  }

  render() {
    const nodes = [];
    const spans = [];
    let at = 0;
    for (const [index, word] of this.words.entries()) {
      if (word.start > at) nodes.push(document.createTextNode(this.text.slice(at, word.start)));
      const span = document.createElement("span");
      span.className = word.state ? `word ${word.state}` : "word";
      span.dataset.index = String(index);
      span.dataset.from = String(word.from); // its seconds in the stream, for tests
      span.dataset.to = String(word.to);
      span.textContent = this.text.slice(word.start, word.end);
      if (word.said && word.said !== span.textContent) span.title = `said: ${word.said}`;
      nodes.push(span);
      spans.push(span);
      at = word.end;
    }
    if (at < this.text.length) nodes.push(document.createTextNode(this.text.slice(at)));
    this.element.replaceChildren(...nodes);
    this.spans = spans;
    this.element.dataset.words = String(spans.length);
    this.current = -1;
    this.element.dataset.current = "-1";
    if (this.stoppedAt === null) this.show();
  }

  // The words' states at the clock: spoken (ended), speaking (the last begun, heard now or
  // just now).
  show() {
    const now = this.clock();
    const wall = performance.now();
    let current = -1;
    for (const [index, word] of this.words.entries()) {
      if (word.state) continue; // marked at an earlier barge-in
      const ended = word.to <= now + SLACK;
      this.spans[index].classList.toggle("spoken", ended);
      if (ended && word.endedAt === undefined) word.endedAt = wall;
      if (word.from <= now) current = index;
    }
    const begun = this.words[current];
    if (begun && begun.endedAt !== undefined && wall - begun.endedAt >= LINGER_MS) current = -1;
    if (current !== this.current) {
      if (this.current >= 0) this.spans[this.current].classList.remove("speaking");
      if (current >= 0) this.spans[current].classList.add("speaking");
      this.current = current;
      this.element.dataset.current = String(current);
    }
    const last = this.words[this.words.length - 1];
    return !(this.ended && current === -1 && (!last || last.to <= now + SLACK));
  }

  mark() {
    let heard = 0;
    for (const [index, word] of this.words.entries()) {
      if (word.state) continue;
      const wasHeard = word.to <= this.stoppedAt + SLACK;
      this.spans[index].classList.remove("speaking", "spoken");
      this.spans[index].classList.add(wasHeard ? "heard" : "unheard");
      if (wasHeard) heard += 1;
    }
    this.current = -1;
    this.element.dataset.current = "-1";
    this.element.dataset.heard = String(heard);
    this.element.dataset.stoppedAt = this.stoppedAt.toFixed(3);
  }

  // The words of the run a barge-in ended keep their marks: the next run's are new ones.
  freeze() {
    for (const [index, word] of this.words.entries()) {
      if (word.state) continue;
      word.state = this.spans[index].classList.contains("heard") ? "heard" : "unheard";
    }
  }

  // Follow the clock, a frame at a time, until stopped, ended or replaced.
  follow() {
    if (this.frame !== null) return;
    const tick = () => {
      this.frame = null;
      if (this.stoppedAt !== null) return;
      if (this.show()) this.frame = requestAnimationFrame(tick);
    };
    this.frame = requestAnimationFrame(tick);
  }
}
