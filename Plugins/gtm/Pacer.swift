import PylonCore

/// Keeps evaluation work from holding the plugin's loop: work runs at once while the current
/// loop turn has spent less than `budgetNs` on it; past that it waits in order for later turns,
/// so the loop reads its channel (heartbeats included) between them. Each evaluation is bounded
/// on its own (`maxEvaluationSteps`, `maxEvaluationBytes`); this bounds a run of them (a
/// pipeline of expensive `getValue`s, a queue of pushes).
final class Pacer {
    private let loop: Loop
    var budgetNs: UInt64
    /// Work waiting at once: one more is refused (the caller answers -32004).
    var maxQueued: Int
    private var turnStartNs: UInt64?
    private var queue: [() -> Void] = []
    private var head = 0
    private var timer: Timer?
    private(set) var deferred = 0

    init(loop: Loop, budgetMs: Int64, maxQueued: Int) {
        self.loop = loop
        budgetNs = UInt64(max(1, budgetMs)) * 1_000_000
        self.maxQueued = maxQueued
    }

    var queued: Int { queue.count - head }

    /// Whether work given now would wait (this turn's budget is spent, or work waits already).
    var shouldYield: Bool {
        guard let t = turnStartNs else { return false }
        return queued > 0 || Loop.hrtimeNs &- t >= budgetNs
    }

    /// Runs `work` now or in a later turn; false (nothing run) when `maxQueued` are waiting.
    func run(_ work: @escaping () -> Void) -> Bool {
        let now = Loop.hrtimeNs
        if turnStartNs == nil {
            turnStartNs = now
            arm()
        }
        if queued == 0 && now &- turnStartNs! < budgetNs {
            work()
            return true
        }
        guard queued < maxQueued else { return false }
        queue.append(work)
        deferred += 1
        return true
    }

    /// A new turn starts when the timer fires, after the loop polled its channels. 1 ms, not 0:
    /// libuv runs a timer re-armed with 0 from its own callback again in the same pass, before
    /// any I/O (the loop would never read its channel).
    private func arm() {
        if timer == nil { timer = Timer(loop: loop) { [unowned self] in self.turn() } }
        timer?.start(after: 1)
    }

    private func turn() {
        turnStartNs = nil
        guard queued > 0 else { return }
        let start = Loop.hrtimeNs
        turnStartNs = start
        arm()
        while head < queue.count, Loop.hrtimeNs &- start < budgetNs {
            let w = queue[head]
            head += 1
            w()
        }
        if head == queue.count {
            queue.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 1024 {
            queue.removeFirst(head)
            head = 0
        }
    }
}
