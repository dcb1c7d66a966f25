import PylonCore
import PylonProtocol

/// The host's expensive read-only answers kept as the bytes of their `result`, built once and
/// shared by every caller who would see the same text (docs/PROTOCOL.md, "Batches"):
///
/// - `bus.describe` (either format), per view — everything (admins, plugins) or a caller that
///   provides no method of its own — until what it shows changes: a plugin's state or manifest,
///   the plugin set, the provided methods (`Version`).
/// - `bus.status`, per view — everything, or one client's own — for the rest of the loop turn
///   and until a host method changes state (`StatusStamp`): every `bus.status` answered in one
///   turn between two changes is the same snapshot.
///
/// No I/O: `Bus` says what each answer depends on and builds it when asked. Unit-tested in
/// ReportCacheTests.
struct ReportCache {
    /// What a `bus.describe` answer shows besides the caller: each plugin slot (in order) with its
    /// revision (`PluginSlot.revision`), the revision of the slot set (a slot added, removed or
    /// replaced: a new slot object may reuse a freed one's address), and the revision of the
    /// provided methods.
    struct Version: Equatable {
        var slots: [Mark]
        var slotSet: UInt64 = 0
        var provided: UInt64
    }
    struct Mark: Equatable {
        var slot: ObjectIdentifier
        var revision: UInt64
    }

    enum DescribeView: Hashable {
        case pylon(all: Bool)
        case openrpc(all: Bool)
    }

    /// When a `bus.status` snapshot was taken: the loop turn, the host's state revision
    /// (`Bus.stateRevision`), and the plugins' and provided methods' version.
    struct StatusStamp: Equatable {
        var turn: UInt64
        var revision: UInt64
        var version: Version
    }

    enum StatusView: Hashable {
        case all
        case client(UInt64)
    }

    private var describes: [DescribeView: (version: Version, text: [UInt8])] = [:]
    private var statuses: [StatusView: [UInt8]] = [:]
    private var statusStamp: StatusStamp?
    /// Own-view status snapshots kept in one turn at most: beyond it each is built (and charged)
    /// as it always was, so the cache holds a bounded number of bytes whoever asks.
    static let maxStatusViews = 64

    /// Describe texts built (for tests and the docs' claim: once per version and view).
    private(set) var describeBuilds = 0
    private(set) var statusBuilds = 0

    /// The `bus.describe` result for `view` at `version`: the kept bytes, or `build()`'s, kept.
    mutating func describe(_ view: DescribeView, _ version: Version, build: () -> [UInt8]) -> [UInt8] {
        if let kept = describes[view], kept.version == version { return kept.text }
        let text = build()
        describeBuilds += 1
        describes[view] = (version, text)
        return text
    }

    /// The `bus.status` result for `view` at `stamp`: the snapshot taken since the stamp last
    /// changed, or `build()`'s, kept.
    mutating func status(_ view: StatusView, _ stamp: StatusStamp, build: () -> [UInt8]) -> [UInt8] {
        if statusStamp != stamp {
            statusStamp = stamp
            statuses.removeAll(keepingCapacity: true)
        }
        if let kept = statuses[view] { return kept }
        let text = build()
        statusBuilds += 1
        if case .client = view, statuses.count >= Self.maxStatusViews { return text }
        statuses[view] = text
        return text
    }
}

extension Bus {
    /// The version of what `bus.describe` shows (`ReportCache.Version`).
    var describeVersion: ReportCache.Version {
        ReportCache.Version(
            slots: pluginSet.slotOrder.compactMap { name in
                pluginSet.slots[name].map { ReportCache.Mark(slot: ObjectIdentifier($0), revision: $0.revision) }
            },
            slotSet: pluginSet.slotSetRevision, provided: peerTable.providedRevision)
    }

    /// The result bytes of a `bus.status` or `bus.describe` request, from `reports` when the
    /// caller's view is one that is shared; nil when the answer is not one to share (a caller
    /// that provides methods of its own sees them in `bus.describe`; parameters that are
    /// refused): the caller builds it as before.
    func reportText(_ peer: Peer, _ principal: Principal, _ method: String, _ params: JSON?) -> [UInt8]? {
        let all = seesEverything(principal)
        if method == HostMethod.status {
            let view: ReportCache.StatusView = all ? .all : .client(peer.id)
            let stamp = ReportCache.StatusStamp(turn: loop.turn, revision: hostState.stateRevision, version: describeVersion)
            return hostState.reports.status(view, stamp) { Bus.resultText(status(for: peer, principal)) }
        }
        guard method == HostMethod.describe, all || peer.provided.isEmpty else { return nil }
        let view: ReportCache.DescribeView
        switch params?["format"] {
        case nil, .null?, .string("pylon")?: view = .pylon(all: all)
        case .string("openrpc")?: view = .openrpc(all: all)
        default: return nil  // refused by `describe`
        }
        return hostState.reports.describe(view, describeVersion) {
            // A view without its own provided methods: `describe` shows the same to any such caller.
            (try? describe(for: peer, principal, params)).map(Bus.resultText) ?? Array("null".utf8)
        }
    }

    static func resultText(_ j: JSON) -> [UInt8] {
        var out = [UInt8]()
        JSONRef(j).withSerialized { out.append(contentsOf: $0) }
        return out
    }
}
