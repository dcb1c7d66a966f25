import CSystemd

#if canImport(Glibc)
import Glibc
#endif

/// Structured logs: one logfmt line per event on stderr (`ts=… level=… msg="…" key=value …`),
/// which grep reads well. When stderr is the journal (systemd's `JOURNAL_STREAM` names stderr's
/// device and inode) each event is instead a native journal entry (`sd_journal_sendv`) with
/// `PRIORITY`, `PYLON_COMPONENT` and every field as `PYLON_<KEY>` (see `Log.Output`).
public struct Log: Sendable {
    public enum Level: Int, Comparable, Sendable {
        case debug = 0, info, warn, error
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        public var name: String { ["debug", "info", "warn", "error"][rawValue] }
        /// syslog priority (sd-daemon `<N>` prefix, journal `PRIORITY`).
        public var syslogPriority: Int { [7, 6, 4, 3][rawValue] }
        public init?(name: String) {
            switch name {
            case "debug": self = .debug
            case "info": self = .info
            case "warn", "warning": self = .warn
            case "error": self = .error
            default: return nil
            }
        }
    }

    nonisolated(unsafe) public static var minimum: Level = .info
    public let component: String
    public init(_ component: String) { self.component = component }

    public func debug(_ msg: String, _ fields: KeyValuePairs<String, any CustomStringConvertible> = [:]) {
        emit(.debug, msg, fields)
    }
    public func info(_ msg: String, _ fields: KeyValuePairs<String, any CustomStringConvertible> = [:]) {
        emit(.info, msg, fields)
    }
    public func warn(_ msg: String, _ fields: KeyValuePairs<String, any CustomStringConvertible> = [:]) {
        emit(.warn, msg, fields)
    }
    public func error(_ msg: String, _ fields: KeyValuePairs<String, any CustomStringConvertible> = [:]) {
        emit(.error, msg, fields)
    }

    public func emit(_ level: Level, _ msg: String, _ fields: KeyValuePairs<String, any CustomStringConvertible>) {
        guard level >= Log.minimum else { return }
        Log.record(level, component: component, msg: msg, fields: fields.map { ($0.key, $0.value.description) })
    }

    /// Writes an already formatted line to stderr.
    public static func writeRaw(_ line: String) {
        var l = line
        l.withUTF8 { b in _ = write(2, b.baseAddress, b.count) }
    }

    /// Quotes a value when it holds spaces, quotes, `=`, or anything that is not printable
    /// ASCII; inside quotes, characters that could forge or disguise a log line are escaped as
    /// `\u{…}` (see `isDisguising`).
    public static func quote(_ s: String) -> String {
        var needs = s.isEmpty
        for u in s.utf8 where u <= 0x20 || u >= 0x7F || u == 0x22 || u == 0x3D || u == 0x5C { needs = true; break }
        guard needs else { return s }
        var out = "\""
        for ch in s.unicodeScalars {
            switch ch {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default: appendShown(ch, to: &out)
            }
        }
        return out + "\""
    }

    /// Characters a log value must not carry raw: C0 controls, DEL and C1 controls (terminal
    /// escapes), line and paragraph separators (U+2028/9: new lines to some viewers), and the
    /// bidirectional controls and marks (U+202A–E, U+2066–9, U+200E/F, U+061C: text shown
    /// reversed), and U+FEFF.
    /// Appends `ch`, written as `\u{…}` when `isDisguising`.
    static func appendShown(_ ch: Unicode.Scalar, to out: inout String) {
        if isDisguising(ch) { out += "\\u{\(String(ch.value, radix: 16))}" } else { out.unicodeScalars.append(ch) }
    }

    public static func isDisguising(_ ch: Unicode.Scalar) -> Bool {
        switch ch.value {
        case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069, 0x200E, 0x200F, 0x061C, 0xFEFF: return true
        default: return false
        }
    }

    /// UTC time as RFC 3339 with milliseconds.
    public static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var t = ts.tv_sec
        var tmv = tm()
        gmtime_r(&t, &tmv)
        func p(_ v: Int32, _ w: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, w - s.count)) + s
        }
        return "\(p(tmv.tm_year + 1900, 4))-\(p(tmv.tm_mon + 1, 2))-\(p(tmv.tm_mday, 2))T"
            + "\(p(tmv.tm_hour, 2)):\(p(tmv.tm_min, 2)):\(p(tmv.tm_sec, 2)).\(p(Int32(ts.tv_nsec / 1_000_000), 3))Z"
    }
}
