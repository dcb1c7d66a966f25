import PylonCore

/// The low-priority lane on the backend's loop: ingest batches (and, in NATS mode, the ledger
/// and index writes that follow JetStream's acknowledgement) are queued here and run a slice at
/// a time, after the loop has read what arrived meanwhile. Everything else — admin and
/// automation sends, device registration, acks from the broker, the console — is handled as it
/// is read, so a send waits behind at most one slice of ingest, not behind every batch that
/// arrived before it (docs/FLEET.md, "Sends and ingest").
///
/// Bounded without a limit of its own: an HTTP connection hands the application one request
/// at a time and answers in order, so the lane holds at most one batch per open connection
/// (`--max-connections`), plus one ledger write per batch JetStream has not acknowledged
/// (`--nats-max-pending`).
final class IngestLane {
    /// How long one turn of the loop may spend on queued batches before it reads again.
    static let sliceNs: UInt64 = 2_000_000

    private let loop: Loop
    private var jobs: [() -> Void] = []
    private var head = 0
    private var scheduled = false
    /// Jobs run since start, and the most that were ever waiting (`/v1/inspect/stats`).
    private(set) var ran = 0
    private(set) var peakDepth = 0

    init(loop: Loop) { self.loop = loop }

    /// Jobs waiting now.
    var depth: Int { jobs.count - head }

    /// Queues `job` to run after this turn's reads, in order of arrival.
    func enqueue(_ job: @escaping () -> Void) {
        jobs.append(job)
        peakDepth = max(peakDepth, depth)
        schedule()
    }

    private func schedule() {
        guard !scheduled, depth > 0 else { return }
        scheduled = true
        loop.nextTurn { [unowned self] in self.runSlice() }
    }

    /// Runs jobs until the slice is spent (at least one), then yields to the loop's reads.
    private func runSlice() {
        scheduled = false
        let start = Loop.hrtimeNs
        repeat {
            let job = jobs[head]
            jobs[head] = {}
            head += 1
            ran += 1
            job()
        } while depth > 0 && Loop.hrtimeNs &- start < IngestLane.sliceNs
        if head == jobs.count {
            jobs.removeAll(keepingCapacity: jobs.count <= 4096)
            head = 0
        } else if head >= 4096 {
            jobs.removeFirst(head)
            head = 0
        }
        schedule()
    }
}
