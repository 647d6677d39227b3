// Publishing a dead letter the way the Rust `Publisher` does (crates/fleet-budget-amqp/src/
// publish.rs; the Python client's publish.py): `mandatory`, on a channel in confirm mode, and
// only a broker ack with no returned message counts. Anything else (a nack, a return, a timeout,
// a closed channel or connection) raises NotConfirmed, and the caller must not let the job go.
// One connection per publisher, opened on first use and again after a failure, tried node by
// node; every step bounded by `timeoutMs`.

import { connect } from "amqplib";
import type { ChannelModel, ConfirmChannel } from "amqplib";
import { redactText, redactUrl } from "./names.js";

/** Longest AMQP short string (exchange names, routing keys). */
export const SHORT_STRING_MAX = 255;

/** The broker did not confirm the copy; the job must stay (it runs again). */
export class NotConfirmed extends Error {
  override name = "NotConfirmed";
}

/** A copy the broker can never take (a name over 255 bytes). */
export class PermanentlyRefused extends NotConfirmed {
  override name = "PermanentlyRefused";
}

/** The routing key of a copy to a fanout exchange: the original's when it fits a short string. */
export function fanoutKey(routingKey: string): string {
  return Buffer.byteLength(routingKey, "utf8") <= SHORT_STRING_MAX ? routingKey : "";
}

function withTimeout<T>(what: string, ms: number, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new NotConfirmed(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

export interface PublishProperties {
  contentType?: string;
  messageId?: string;
  timestamp?: number;
}

export class ConfirmedPublisher {
  private connection: ChannelModel | null = null;
  private channel: ConfirmChannel | null = null;
  private returned: string[] = [];
  private opening: Promise<ConfirmChannel> | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  /** Queues declared on the connection in use. */
  private declared = new Set<string>();

  constructor(private readonly urls: readonly string[], private readonly timeoutMs = 10_000) {
    if (urls.length === 0) throw new Error("a publisher needs at least one broker URL");
  }

  /** Publishes and waits for the confirm; throws NotConfirmed otherwise. One publish at a time. */
  publish(exchange: string, routingKey: string, body: Buffer, headers: Record<string, unknown>, properties: PublishProperties = {}): Promise<void> {
    const run = this.queue.then(() => this.publishNow(exchange, routingKey, body, headers, properties));
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Declares a durable queue (once per publisher and name; again after a lost connection). */
  declareQueue(name: string): Promise<void> {
    const run = this.queue.then(() => this.declareNow(name));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async declareNow(name: string): Promise<void> {
    if (Buffer.byteLength(name, "utf8") > SHORT_STRING_MAX) {
      throw new PermanentlyRefused(`queue ${JSON.stringify(name.slice(0, 64))}... is longer than ${SHORT_STRING_MAX} bytes`);
    }
    try {
      const channel = await this.open();
      if (this.declared.has(name)) return;
      await withTimeout(`declare queue ${JSON.stringify(name)}`, this.timeoutMs, channel.assertQueue(name, { durable: true }));
      this.declared.add(name);
    } catch (e) {
      this.drop();
      if (e instanceof NotConfirmed) throw e;
      throw new NotConfirmed(`declare queue ${JSON.stringify(name)} failed: ${redactText((e as Error)?.message ?? String(e))}`);
    }
  }

  private async publishNow(exchange: string, routingKey: string, body: Buffer, headers: Record<string, unknown>, properties: PublishProperties): Promise<void> {
    for (const [what, name] of [["exchange", exchange], ["routing key", routingKey]] as const) {
      if (Buffer.byteLength(name, "utf8") > SHORT_STRING_MAX) {
        throw new PermanentlyRefused(`${what} ${JSON.stringify(name.slice(0, 64))}... is longer than ${SHORT_STRING_MAX} bytes`);
      }
    }
    try {
      const channel = await this.open();
      this.returned = [];
      await withTimeout(`publish to ${JSON.stringify(exchange)}`, this.timeoutMs, new Promise<void>((resolve, reject) => {
        try {
          channel.publish(exchange, routingKey, body, { headers, mandatory: true, persistent: true, ...properties }, (err) => {
            if (err) reject(new NotConfirmed(`publish to ${JSON.stringify(exchange)} nacked by the broker`));
            else resolve();
          });
        } catch (e) {
          reject(e);
        }
      }));
    } catch (e) {
      this.drop();
      if (e instanceof NotConfirmed) throw e;
      throw new NotConfirmed(`publish to ${JSON.stringify(exchange)} not confirmed: ${redactText((e as Error)?.message ?? String(e))}`);
    }
    if (this.returned.length > 0) throw new NotConfirmed(`publish to ${JSON.stringify(exchange)} returned unroutable: ${this.returned[0]}`);
  }

  private open(): Promise<ConfirmChannel> {
    if (this.channel !== null) return Promise.resolve(this.channel);
    if (this.opening === null) {
      this.opening = this.connectAny().finally(() => {
        this.opening = null;
      });
    }
    return this.opening;
  }

  private async connectAny(): Promise<ConfirmChannel> {
    const problems: string[] = [];
    for (const url of this.urls) {
      let connection: ChannelModel | null = null;
      try {
        connection = await withTimeout(`connect to ${redactUrl(url)}`, this.timeoutMs, connect(url, { timeout: this.timeoutMs }));
        const channel = await withTimeout("open a confirm channel", this.timeoutMs, connection.createConfirmChannel());
        const forget = () => {
          if (this.connection === connection) this.drop();
        };
        connection.on("error", () => {});
        connection.on("close", forget);
        channel.on("error", () => {});
        channel.on("close", forget);
        channel.on("return", (message) => {
          this.returned.push(`${(message.fields as unknown as { replyText?: string }).replyText ?? "returned"} (exchange ${JSON.stringify(message.fields.exchange)}, routing key ${JSON.stringify(message.fields.routingKey)})`);
        });
        this.connection = connection;
        this.channel = channel;
        return channel;
      } catch (e) {
        problems.push(`${redactUrl(url)}: ${redactText((e as Error)?.message ?? String(e))}`);
        if (connection !== null) connection.close().catch(() => undefined);
      }
    }
    throw new NotConfirmed(`cannot reach the broker: ${problems.join("; ")}`);
  }

  private drop(): void {
    this.declared.clear();
    const connection = this.connection;
    this.connection = null;
    this.channel = null;
    if (connection !== null) connection.close().catch(() => undefined);
  }

  async close(): Promise<void> {
    await this.queue;
    this.drop();
  }
}
