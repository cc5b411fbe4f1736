/**
 * An incremental parser of Server-Sent Events (the `text/event-stream` format of the HTML
 * standard): bytes in, messages out, whatever the chunk boundaries.
 */

/** The most bytes one line, or the data of one message, may have. */
export const MAX_LINE = 1 << 20;

/** One dispatched message: the fields seen since the previous blank line. */
export interface Message {
  id?: string;
  event?: string;
  data?: string;
}

const LF = 0x0a;
const CR = 0x0d;

/** The parser's state between chunks. */
export class Parser {
  private line: Uint8Array[] = [];
  private lineLength = 0;
  private afterCr = false;
  private pending: Message = {};
  private dataLength = 0;
  /** A line or one message's data went over MAX_LINE: nothing more is parsed. */
  overflowed = false;

  /** Feeds `bytes`; returns the messages completed by them (up to an overflow). */
  feed(bytes: Uint8Array): Message[] {
    const out: Message[] = [];
    let start = 0;
    for (let i = 0; i < bytes.length && !this.overflowed; i++) {
      const b = bytes[i];
      if (this.afterCr && b === LF) {
        this.afterCr = false;
        start = i + 1;
        continue;
      }
      this.afterCr = false;
      if (b !== LF && b !== CR) continue;
      this.take(bytes.subarray(start, i));
      this.afterCr = b === CR;
      start = i + 1;
      if (this.overflowed) break;
      const message = this.lineEnded();
      if (message !== undefined) out.push(message);
    }
    if (!this.overflowed) this.take(bytes.subarray(start));
    return out;
  }

  private take(part: Uint8Array): void {
    if (part.length === 0) return;
    this.lineLength += part.length;
    if (this.lineLength > MAX_LINE) return this.overflow();
    this.line.push(part.slice());
  }

  private overflow(): void {
    this.overflowed = true;
    this.line = [];
    this.pending = {};
  }

  /** Handles one complete line; a blank line dispatches the pending message. */
  private lineEnded(): Message | undefined {
    const bytes = Buffer.concat(this.line);
    this.line = [];
    this.lineLength = 0;
    if (bytes.length === 0) {
      const message = this.pending;
      this.pending = {};
      this.dataLength = 0;
      return Object.keys(message).length > 0 ? message : undefined;
    }
    if (bytes[0] === 0x3a) return undefined; // a comment
    const line = bytes.toString("utf8");
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id" && !value.includes("\0")) this.pending.id = value;
    else if (field === "event") this.pending.event = value;
    else if (field === "data") {
      this.dataLength += value.length + 1;
      if (this.dataLength > MAX_LINE) this.overflow();
      else this.pending.data = this.pending.data === undefined ? value : `${this.pending.data}\n${value}`;
    }
    return undefined;
  }
}
