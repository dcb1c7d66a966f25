import PylonPluginKit
import PylonStore

/// The queue against the consent view. Whenever the view may have changed — at every
/// (re)start, with the host's snapshot, and at every `consent.changed` — every record on disk
/// whose switch is denied (its stream's fixed switch, the switch it was stored under, or the
/// master switch `device`) goes once as a final batch (no retry) and is then purged, and every
/// pending batch holding such records becomes final. New enqueues under a denied switch are
/// refused (`enqueue` checks the same view), so nothing more is accepted or retried while it
/// stays denied.
extension Uploader {
    func consentChanged(key: String, granted: Bool) {
        reconcileConsent()
    }

    func reconcileConsent() {
        commit()  // anything accepted before the change is part of the final batch
        // The pixel sender looks through its streams' pending pixels again: final ones are purged.
        pixelSender.scanned.removeAll()
        var finalized: [String] = []
        do {
            // Streams whose own switch is denied (or all, while `device` is denied).
            for (name, st) in streams where (st.queued > 0 || !st.pendingBatches.isEmpty) && !allows(st.consentKey) {
                try store.markFinal(stream: name)
                try cutFinalBatches(name, consent: nil)
                finalized.append(name)
            }
            // Records stored under a switch that differs from their stream's (queued before the
            // switch was fixed by the stream's name).
            for key in try store.consentKeys() where !allows(key) {
                try store.markFinal(consent: key)
                for name in try store.streams(withConsent: key) {
                    try cutFinalBatches(name, consent: key)
                    finalized.append(name)
                }
            }
        } catch {
            plugin.log.error("consent reconciliation failed", ["error": "\(error)"])
        }
        if !finalized.isEmpty {
            plugin.log.info("consent denied: final batches queued", ["streams": finalized.count, "master": plugin.consentMaster])
        }
        pumpAll()
    }

    /// Cuts every unbatched record of `name` (under `consent`, or any) into final batches, sent
    /// at once.
    private func cutFinalBatches(_ name: String, consent: String?) throws {
        var st = state(name)
        var cuts: [(key: String, count: Int, bytes: Int)] = []
        while true {
            let bkey = System.randomHex(16)
            let (n, cutBytes) = try store.cutBatch(
                stream: name, key: bkey, maxCount: StreamSettings.maxCountLimit,
                maxBytes: st.settings.maxBatchBytes, final: true, consent: consent,
                nowMs: System.wallClockMs())
            if n == 0 { break }
            cuts.append((bkey, n, cutBytes))
        }
        st.finalized(cuts: cuts)
        streams[name] = st
    }
}
