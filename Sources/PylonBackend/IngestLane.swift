import PylonCore

/// The low-priority lane on the backend's loop: ingest batches (and, in NATS mode, the ledger
/// and index writes that follow JetStream's acknowledgement) are queued here and run a slice at
/// a time, after the loop has read what arrived meanwhile. Everything else — admin and
/// automation sends, device registration, acks from the broker, the console — is handled as it
/// is read, so a send waits behind at most one slice of ingest, not behind every batch that
/// arrived before it (docs/FLEET.md, "Sends and ingest").
///
/// Group commit: a job may leave its database writes (`Writes`) to the lane, which runs the
/// writes of one slice in one transaction — one COMMIT, one WAL flush, for up to `maxGroup`
/// batches, `--ingest-group` — and only then tells each job (which answers its device). If the group fails, each
/// job's writes run again alone, so one bad batch costs the others nothing but a retry.
///
/// Bounded without a limit of its own: an HTTP connection hands the application one request
/// at a time and answers in order, so the lane holds at most one batch per open connection
/// (`--max-connections`), plus one ledger write per batch JetStream has not acknowledged
/// (`--nats-max-pending`).
final class IngestLane {
    /// How long one turn of the loop may spend on queued batches before it reads again.
    static let defaultSliceNs: UInt64 = 2_000_000
    let sliceNs: UInt64
    /// Most jobs whose writes share one transaction, unless `--ingest-group` says otherwise.
    static let defaultMaxGroup = 64
    let maxGroup: Int

    /// A job's database writes: `write` runs inside the group's transaction (and may run again,
    /// alone or on a conflict: it must have no effect outside the database); `done` runs once,
    /// after the commit (nil) or with the error that stopped the writes.
    struct Writes {
        let write: () throws(StoreError) -> Void
        let done: (StoreError?) -> Void
    }

    private let loop: Loop
    /// Commits a group of writes (`Backend.commit(_:)`).
    private let commit: ([Writes]) -> Void
    private var jobs: [() -> Writes?] = []
    private var head = 0
    private var scheduled = false
    /// Jobs run since start, the most that were ever waiting, and group commits
    /// (`/v1/inspect/stats`).
    private(set) var ran = 0
    private(set) var peakDepth = 0
    private(set) var commits = 0

    /// `sliceNs`: the time budget of a turn (tests that count groups give one that never runs out).
    init(
        loop: Loop, maxGroup: Int = IngestLane.defaultMaxGroup, sliceNs: UInt64 = IngestLane.defaultSliceNs,
        commit: @escaping ([Writes]) -> Void
    ) {
        self.loop = loop
        self.maxGroup = max(1, maxGroup)
        self.sliceNs = sliceNs
        self.commit = commit
    }

    /// Jobs waiting now.
    var depth: Int { jobs.count - head }

    /// Run nothing while set (the `holdIngest` fault: a store that cannot keep up).
    var held = false {
        didSet { schedule() }
    }

    /// Queues `job` to run after this turn's reads, in order of arrival. The job answers by
    /// itself, or returns the writes whose commit answers it.
    func enqueue(_ job: @escaping () -> Writes?) {
        jobs.append(job)
        peakDepth = max(peakDepth, depth)
        schedule()
    }

    private func schedule() {
        guard !scheduled, !held, depth > 0 else { return }
        scheduled = true
        loop.nextTurn { [unowned self] in self.runSlice() }
    }

    /// Runs jobs until the slice is spent (at least one) or a group is full, commits their
    /// writes, then yields to the loop's reads.
    private func runSlice() {
        scheduled = false
        guard !held else { return }
        let start = Loop.hrtimeNs
        var group: [Writes] = []
        repeat {
            let job = jobs[head]
            jobs[head] = { nil }
            head += 1
            ran += 1
            if let w = job() { group.append(w) }
        } while depth > 0 && group.count < maxGroup && Loop.hrtimeNs &- start < sliceNs
        if !group.isEmpty {
            commits += 1
            commit(group)
        }
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
