import CSystemd

#if canImport(Glibc)
import Glibc
#endif

/// Where log events go: logfmt lines, logfmt with sd-daemon `<N>` priority prefixes, or native
/// journal entries.
extension Log {
    public enum Output: String, Sendable {
        /// `ts=… level=… component=… msg=… key=value …` on stderr.
        case logfmt
        /// The same line prefixed with `<N>` (syslog priority), which journald and other
        /// sd-daemon-aware collectors turn into the entry's priority.
        case prefixed
        /// Native journal entries through `sd_journal_sendv`.
        case journal
    }

    /// Chosen once per process: `PYLON_LOG_FORMAT` (`logfmt`, `prefixed`, `journal`; `auto` or
    /// unset = detect), else `journal` when stderr is the journal stream, else `logfmt`.
    nonisolated(unsafe) public static var output: Output = detectOutput(System.env)

    public static func detectOutput(_ env: (String) -> String?) -> Output {
        if let f = env("PYLON_LOG_FORMAT"), let o = Output(rawValue: f) { return o }
        // JOURNAL_STREAM is "DEVICE:INODE" of the stream systemd connected; it is inherited by
        // children whose stderr may be something else, so compare with stderr itself.
        guard let js = env("JOURNAL_STREAM") else { return .logfmt }
        let parts = js.split(separator: ":")
        var st = stat()
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]), fstat(2, &st) == 0,
            UInt64(st.st_dev) == dev, UInt64(st.st_ino) == ino
        else { return .logfmt }
        return .journal
    }

    /// Program name for `SYSLOG_IDENTIFIER` (what `journalctl -t` selects).
    static let identifier: String = {
        let a0 = CommandLine.arguments.first ?? "pylon"
        return a0.split(separator: "/").last.map(String.init) ?? a0
    }()

    /// Writes one event in the current output format. `journalFields` are extra journal fields
    /// (already upper-case names such as `PLUGIN`); in logfmt they are appended lower-cased.
    public static func record(
        _ level: Level, component: String, msg: String, fields: [(String, String)],
        journalFields: [(String, String)] = []
    ) {
        if output == .journal {
            var entry: [(String, String)] = [
                ("MESSAGE", fields.isEmpty ? msg : msg + " " + logfmtFields(fields)),
                ("PRIORITY", String(level.syslogPriority)),
                ("SYSLOG_IDENTIFIER", identifier),
                ("PYLON_COMPONENT", component),
                ("PYLON_LEVEL", level.name),
                ("PYLON_MSG", msg),
            ]
            entry += journalFields
            for (k, v) in fields { entry.append(("PYLON_" + journalFieldName(k), v)) }
            // The host's own events about a plugin (spawned, exited, ...) also match
            // `journalctl PLUGIN=<name>`, like the plugin's relayed lines.
            if !journalFields.contains(where: { $0.0 == "PLUGIN" }), let p = fields.first(where: { $0.0 == "plugin" }) {
                entry.append(("PLUGIN", p.1))
            }
            if sendJournal(entry) { return }
        }
        var line = output == .prefixed ? "<\(level.syslogPriority)>" : ""
        line += "ts=\(timestamp()) level=\(level.name) component=\(component) msg=\(quote(msg))"
        if !fields.isEmpty { line += " " + logfmtFields(fields) }
        for (k, v) in journalFields { line += " \(k.lowercased())=\(quote(v))" }
        writeRaw(line + "\n")
    }

    static func logfmtFields(_ fields: [(String, String)]) -> String {
        fields.map { "\($0.0)=\(quote($0.1))" }.joined(separator: " ")
    }

    /// A journal field name: upper-case letters, digits and `_`, not starting with a digit.
    public static func journalFieldName(_ key: String) -> String {
        var out = ""
        for u in key.utf8.prefix(57) {
            switch u {
            case UInt8(ascii: "a")...UInt8(ascii: "z"): out.unicodeScalars.append(Unicode.Scalar(u - 32))
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): out.unicodeScalars.append(Unicode.Scalar(u))
            default: out += "_"
            }
        }
        return out.isEmpty ? "FIELD" : out
    }

    /// `sd_journal_sendv` with `FIELD=value` entries; false if the journal refused it.
    static func sendJournal(_ entry: [(String, String)]) -> Bool {
        let items: [[UInt8]] = entry.map { Array(($0.0 + "=" + $0.1).utf8) }
        var iov = [iovec]()
        iov.reserveCapacity(items.count)
        return withBuffers(items, index: 0, iov: &iov)
    }

    private static func withBuffers(_ items: [[UInt8]], index: Int, iov: inout [iovec]) -> Bool {
        guard index < items.count else {
            return iov.withUnsafeBufferPointer { sd_journal_sendv($0.baseAddress, Int32($0.count)) } >= 0
        }
        return items[index].withUnsafeBytes { b in
            iov.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress), iov_len: b.count))
            return withBuffers(items, index: index + 1, iov: &iov)
        }
    }

    /// Parses a logfmt line (`key=value key="quoted \" value" …`) into its pairs, in order.
    public static func parseLogfmt(_ line: String) -> [(String, String)] {
        var out: [(String, String)] = []
        let s = Array(line.unicodeScalars)
        var i = 0
        while i < s.count {
            while i < s.count, s[i] == " " { i += 1 }
            var key = ""
            while i < s.count, s[i] != "=", s[i] != " " { key.unicodeScalars.append(s[i]); i += 1 }
            guard i < s.count, s[i] == "=" else {
                if !key.isEmpty { out.append((key, "")) }
                continue
            }
            i += 1
            var value = ""
            if i < s.count, s[i] == "\"" {
                i += 1
                while i < s.count, s[i] != "\"" {
                    if s[i] == "\\", i + 1 < s.count {
                        i += 1
                        switch s[i] {
                        case "n": value += "\n"
                        case "r": value += "\r"
                        case "t": value += "\t"
                        default: value.unicodeScalars.append(s[i])
                        }
                    } else {
                        value.unicodeScalars.append(s[i])
                    }
                    i += 1
                }
                i += 1
            } else {
                while i < s.count, s[i] != " " { value.unicodeScalars.append(s[i]); i += 1 }
            }
            if !key.isEmpty { out.append((key, value)) }
        }
        return out
    }

    /// Relays one stderr/stdout line of a plugin: a line in Pylon's logfmt (the plugin kit's) keeps
    /// its level, component and fields and gains the plugin's name and pid (journal: `PLUGIN`,
    /// `PLUGIN_PID`); any other line becomes the message of an event at `level`.
    /// `line` with every character `isDisguising` finds (U+2028, C1 controls, bidi controls,
    /// DEL, …) written as `\u{…}`: a plugin's own logfmt line is relayed as it is otherwise.
    static func escapingDisguises(_ line: String) -> String {
        guard line.utf8.contains(where: { $0 >= 0x7F || $0 < 0x20 }) else { return line }
        var out = ""
        for ch in line.unicodeScalars { appendShown(ch, to: &out) }
        return out
    }

    public static func relayPluginLine(_ line: String, plugin: String, pid: Int32, level: Level) {
        let tags = [("PLUGIN", plugin), ("PLUGIN_PID", String(pid))]
        guard line.hasPrefix("ts=") else {
            guard level >= minimum else { return }
            record(level, component: "plugin", msg: line, fields: [], journalFields: tags)
            return
        }
        if output == .logfmt {
            writeRaw(escapingDisguises(line) + " plugin=\(plugin) pid=\(pid)\n")
            return
        }
        var lv = level, component = "plugin", msg = ""
        var fields: [(String, String)] = []
        for (k, v) in parseLogfmt(line) {
            switch k {
            case "ts": continue
            case "level": lv = Level(name: v) ?? level
            case "component": component = v
            case "msg": msg = v
            default: fields.append((k, v))
            }
        }
        record(lv, component: component, msg: msg, fields: fields, journalFields: tags)
    }
}
