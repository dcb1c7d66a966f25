import PylonCore
import PylonPluginKit
import PylonTagEngine

/// The plugin's logger: the SDK's levels (default warnings and errors), changeable at run time,
/// one level per owner (docs/SECURITY.md, "Tag manager").
///
/// A line about an owner's state (its containers, values, pushes, handlers) goes to stderr (the
/// host's log, the operator's) with the owner named, and into that owner's ring of recent lines,
/// which only that owner and admins read (`gtm.logLines`). It is **not** published on `gtm.log`:
/// the host delivers a publication to every subscriber, whoever they are, so a line there would
/// reach other users. Plugin-wide lines (no owner: the store, start-up) are published on
/// `gtm.log` `{level, message, ts}` and kept in the plugin's own ring (admins). With config
/// `publishOwnerLogLines` (for an operator who made `gtm.log` an admin topic through the host's
/// `disclosure.adminTopics`) owner lines are published too, with their owner.
final class GTMLog {
    let plugin: Plugin
    /// The level of plugin-wide lines, and the initial level of every owner.
    var level: GTMLogLevel
    private var levels: [Owner: GTMLogLevel] = [:]
    private var rings: [Owner?: [Line]] = [:]
    var maxLinesPerOwner = 256
    var maxLineBytes = 2048
    var publishOwnerLines = false
    /// Each owner's lines are rate-limited (`logBurst`, `logLinesPerSecond`): a caller repeating
    /// a failing call cannot flood the host's log. Plugin-wide lines are not.
    var burst = 50
    var perSecond = 10
    private var limiters: [Owner: LineRateLimiter] = [:]
    private var seq: Int64 = 0
    static let topic = "gtm.log"

    struct Line {
        let seq: Int64
        let level: GTMLogLevel
        let message: String
        let ts: Int64
        let owner: Owner?

        var json: JSON {
            var o: JSONObject = ["seq": .int(seq), "level": .string(level.rawValue), "message": .string(message), "ts": .int(ts)]
            if let owner { for (k, v) in owner.json { o[k] = v } }
            return .object(o)
        }
    }

    init(plugin: Plugin, level: GTMLogLevel) {
        self.plugin = plugin
        self.level = level
    }

    /// Lines of `owner` suppressed by the rate limit so far.
    func suppressed(_ owner: Owner) -> Int { limiters[owner]?.totalSuppressed ?? 0 }

    func level(of owner: Owner?) -> GTMLogLevel { owner.flatMap { levels[$0] } ?? level }

    func setLevel(_ l: GTMLogLevel, for owner: Owner) { levels[owner] = l }

    func enabled(_ l: GTMLogLevel, _ owner: Owner?) -> Bool {
        let cur = level(of: owner)
        return cur != .none && l.rank >= cur.rank
    }

    func emit(_ owner: Owner?, _ l: GTMLogLevel, _ message: @autoclosure () -> String) {
        guard enabled(l, owner) else { return }
        var note: String?
        if let owner {
            var lim = limiters[owner] ?? LineRateLimiter(burst: burst, perSecond: perSecond)
            let d = lim.request(nowMs: Int64(Loop.hrtimeNs / 1_000_000))
            limiters[owner] = lim
            switch d {
            case .suppress: return
            case .emit(let n) where n > 0: note = " (\(n) earlier lines of \(owner) suppressed: log rate limit)"
            case .emit: break
            }
        }
        var m = message()
        if m.utf8.count > maxLineBytes { m = String(decoding: m.utf8.prefix(maxLineBytes), as: UTF8.self) + "…" }
        if let note { m += note }
        let text = owner.map { "[\($0)] " + m } ?? m
        switch l {
        case .error: plugin.log.error(text)
        case .warning: plugin.log.warn(text)
        case .info: plugin.log.info(text)
        default: plugin.log.debug(text)
        }
        seq += 1
        let line = Line(seq: seq, level: l, message: m, ts: System.wallClockMs(), owner: owner)
        var ring = rings[owner] ?? []
        if ring.count >= maxLinesPerOwner { ring.removeFirst(ring.count - maxLinesPerOwner + 1) }
        ring.append(line)
        rings[owner] = ring
        if owner == nil || publishOwnerLines { plugin.publish(GTMLog.topic, line.json) }
    }

    /// Recent lines after `since` (oldest first, at most `limit`): `owner`'s, or with `all`
    /// every owner's and the plugin-wide ones (admins).
    func lines(of owner: Owner?, all: Bool, since: Int64, limit: Int) -> [Line] {
        let pool: [Line] = all ? rings.values.flatMap { $0 }.sorted { $0.seq < $1.seq } : rings[owner] ?? []
        return Array(pool.lazy.filter { $0.seq > since }.prefix(limit))
    }

    func verbose(_ o: Owner?, _ m: @autoclosure () -> String) { emit(o, .verbose, m()) }
    func debug(_ o: Owner?, _ m: @autoclosure () -> String) { emit(o, .debug, m()) }
    func info(_ o: Owner?, _ m: @autoclosure () -> String) { emit(o, .info, m()) }
    func warning(_ o: Owner?, _ m: @autoclosure () -> String) { emit(o, .warning, m()) }
    func error(_ o: Owner?, _ m: @autoclosure () -> String) { emit(o, .error, m()) }
}
