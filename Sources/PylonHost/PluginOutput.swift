import PylonCore

/// Sorts the lines a plugin writes to stdout/stderr. Logfmt lines (the plugin kit's) and other
/// text are relayed to the host's log (at the level of an sd-daemon `<N>` prefix, which is
/// removed, else at info: `classify`); blank lines are dropped; a crash report (the Swift
/// runtime's backtracer writes ~45 lines: registers, images, blank separators) is condensed to
/// its reason, which the host's single "plugin exited" warning carries (`crash=`). The report's
/// lines are still logged at debug level.
struct PluginOutputFilter {
    enum Action: Equatable {
        case relay
        case debug
        case drop
    }

    /// "Aborted at 0x…", or a `Fatal error: …` line printed just before the report.
    private(set) var crashReason: String?
    private var inCrashReport = false

    /// The level a line is logged at and its text: an sd-daemon priority prefix (`<0>`…`<7>`,
    /// sd-daemon(3); Python's logging through `pylon.Plugin` writes them) sets the level and is
    /// removed; a line without one is logged at `plain` (info). Crash reports and blank lines
    /// are judged as `take` judges them.
    mutating func classify(_ line: String, plain: Log.Level = .info) -> (action: Action, level: Log.Level, text: String) {
        let (prefixed, text) = Self.priority(line)
        let action = take(text)
        return (action, action == .debug ? .debug : prefixed ?? plain, text)
    }

    /// A line's sd-daemon prefix read off: the level it names (0–3 error, 4 warn, 5–6 info,
    /// 7 debug) and the rest; nil and the line itself when it has none.
    static func priority(_ line: String) -> (level: Log.Level?, text: String) {
        let u = line.utf8
        guard u.count >= 3, u.first == UInt8(ascii: "<") else { return (nil, line) }
        let i = u.index(after: u.startIndex)
        let j = u.index(after: i)
        guard u[j] == UInt8(ascii: ">"), u[i] >= UInt8(ascii: "0"), u[i] <= UInt8(ascii: "7") else { return (nil, line) }
        let level: Log.Level
        switch u[i] - UInt8(ascii: "0") {
        case 0...3: level = .error
        case 4: level = .warn
        case 5, 6: level = .info
        default: level = .debug
        }
        return (level, String(line.utf8[u.index(after: j)...])!)
    }

    mutating func take(_ line: String) -> Action {
        if line.hasPrefix("ts=") { return .relay }
        var t = Substring(line)
        while let f = t.first, f == " " || f == "\t" || f == "\r" { t = t.dropFirst() }
        while let l = t.last, l == " " || l == "\t" || l == "\r" { t = t.dropLast() }
        if t.isEmpty { return .drop }
        if inCrashReport {
            if crashReason == nil || crashReason!.hasPrefix("Signal"), t.hasPrefix("*** Program crashed: ") {
                crashReason = Self.stripStars(t.dropFirst("*** Program crashed: ".count))
            }
            return .debug
        }
        if t.hasPrefix("*** Signal "), t.contains("Backtracing") {
            inCrashReport = true
            if crashReason == nil { crashReason = Self.stripStars(t.dropFirst(4).prefix { $0 != ":" }) }
            return .debug
        }
        if t.contains("Fatal error: ") || t.hasPrefix("Fatal error") {
            crashReason = String(t)
            return .debug
        }
        return .relay
    }

    private static func stripStars(_ s: Substring) -> String {
        var t = s
        while t.hasSuffix("*") || t.hasSuffix(" ") { t = t.dropLast() }
        return String(t)
    }
}
