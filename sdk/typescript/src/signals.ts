/**
 * Combining AbortSignals without `AbortSignal.any`, which Node 18 before 18.17 lacks and whose
 * combined signals Node keeps only weakly (a signal nothing else holds may be collected before
 * its sources abort). A link holds its own controller strongly through listeners on its
 * sources, and removes them once done — so a long-lived signal (a lease's, a session's) linked
 * into request after request does not collect a listener per request.
 */

/** A signal aborted, with its reason, when the first of its sources is. */
export interface Link {
  readonly signal: AbortSignal;
  /** Detaches the link from its sources (idempotent); its signal stays as it is. */
  dispose(): void;
}

/**
 * Links `sources` (undefined ones are skipped): aborted at once if one is aborted already, else
 * when the first one aborts, after which it detaches itself. Dispose it when what it guards is
 * done.
 */
export function link(...sources: (AbortSignal | undefined)[]): Link {
  const controller = new AbortController();
  const live = sources.filter((s): s is AbortSignal => s !== undefined);
  const aborted = live.find((s) => s.aborted);
  if (aborted !== undefined) {
    controller.abort(aborted.reason);
    return { signal: controller.signal, dispose: () => {} };
  }
  const dispose = () => {
    for (const s of live) s.removeEventListener("abort", onAbort);
  };
  const onAbort = (event: Event) => {
    dispose();
    controller.abort((event.target as AbortSignal).reason);
  };
  for (const s of live) s.addEventListener("abort", onAbort, { once: true });
  return { signal: controller.signal, dispose };
}
