import PylonCore

/// Sorts the lines a plugin writes to stdout/stderr. Logfmt lines (the plugin kit's) and other
/// text are relayed to the host's log; blank lines are dropped; a crash report (the Swift
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
