import PylonCore
import PylonPluginKit
import PylonTagEngine

/// Where the container in use came from.
enum ContainerSource: String { case `default`, saved, network }

/// Preview state of a container id, set by a preview URL before the container is opened.
struct PreviewState: Equatable {
    let auth: String
    let preview: String
    let debug: Bool
}

/// One open container: the container in use, where it came from, its refresh machinery and the
/// callers waiting for it (the opener).
final class ContainerInstance {
    let id: String
    /// Whose container this is (each owner opens its own instances).
    let owner: Owner
    var container: Container
    var source: ContainerSource = .default
    /// Fetch time of the container in use; 0 while it is the default (the SDK's `isDefault`).
    var lastRefreshMs: Int64 = 0
    var etag: String?
    var limiter: RefreshRateLimiter
    /// The next automatic network load (one timer, re-armed).
    var refreshTimer: Timer?
    var refreshDueMs: Int64?
    /// A network load is in flight.
    var loading = false
    /// The saved copy has been tried (the first load phase is over).
    var savedPhaseDone = false
    var waiters: [Waiter] = []
    /// Pushes with a sequence number above this were made after the container opened.
    let openedAfterPush: UInt64
    /// The draft this container shows (never saved).
    var preview: PreviewState?
    var defaultFile: String?
    /// An open of this instance has been answered (`replyOpen`). Until then the container is
    /// *opening*: a `getValue` of its owner waits in `valueWaiters` for that answer instead of
    /// evaluating the placeholder (a pipelined getValue behind its own open answered `""`).
    var answered = false
    /// `gtm.getValue` calls waiting for the first open's answer, in arrival order (at most
    /// `GTMLimits.maxValuesWaitingForOpen`); each waits at most as long as that open (its
    /// `timeoutMs`, or a load that releases it sooner).
    var valueWaiters: [Call] = []

    var isDefault: Bool { lastRefreshMs == 0 }
    /// Whether the container in use has content: a default file, a saved copy or the network's.
    /// An instance whose open was answered without any (no default file, the loads failed or
    /// are still running) is not open for values: `getValue` says `open: false, reason: "not_loaded"`.
    var hasContainer: Bool { !isDefault || defaultFile != nil }

    init(id: String, owner: Owner, container: Container, openedAfterPush: UInt64, limiter: RefreshRateLimiter) {
        self.id = id
        self.owner = owner
        self.container = container
        self.openedAfterPush = openedAfterPush
        self.limiter = limiter
    }

    /// A caller of `gtm.openContainer` waiting for the opener's release or its timeout.
    final class Waiter {
        let call: Call
        let type: OpenType
        let startMs: Int64
        var timer: Timer?
        init(call: Call, type: OpenType, startMs: Int64) {
            self.call = call
            self.type = type
            self.startMs = startMs
        }
    }
}
