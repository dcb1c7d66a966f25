import PylonCore

/// What a reload did: plugins added, removed and restarted, and the settings it could not apply
/// (with why), as `bus.reload` answers and the log reports.
public struct ReloadReport: Sendable {
    public var added: [String] = []
    public var removed: [String] = []
    public var restarted: [String] = []
    /// (setting, reason): the running value was kept.
    public var notApplied: [(setting: String, reason: String)] = []
    public init() {}

    public var json: JSON {
        [
            "reloaded": true, "added": .array(added.map { .string($0) }), "removed": .array(removed.map { .string($0) }),
            "restarted": .array(restarted.map { .string($0) }),
            "notApplied": .array(notApplied.map { ["setting": .string($0.setting), "reason": .string($0.reason)] }),
        ]
    }
}

extension HostConfig {
    /// The settings that differ between the running configuration and `new` but are fixed at
    /// start (the socket is bound and the state directory opened once).
    public static func fixedAtStart(running: HostConfig, new: HostConfig) -> [String] {
        var out: [String] = []
        if new.socketPath != running.socketPath { out.append("socket") }
        if new.socketMode != running.socketMode { out.append("socketMode") }
        if new.socketGroup != running.socketGroup { out.append("socketGroup") }
        if new.stateDir != running.stateDir { out.append("stateDir") }
        return out
    }
}
