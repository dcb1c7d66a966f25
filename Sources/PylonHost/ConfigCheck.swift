import CJSONC
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// What `pylond --check-config` verifies beyond parsing: every enabled plugin's executable
/// exists and is executable where the host will look for it.
extension HostConfig {
    /// Line and column (1-based) where json-c stopped parsing `bytes`: the first byte it could not
    /// accept, or the end of the input when the document is incomplete.
    static func jsonErrorLocation(_ bytes: UnsafeRawBufferPointer) -> (line: Int, column: Int) {
        var end = bytes.count
        if let base = bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count > 0,
            let tok = json_tokener_new_ex(1000)
        {
            json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8)
            let obj = json_tokener_parse_ex(tok, base, Int32(bytes.count))
            if json_tokener_get_error(tok) != json_tokener_continue { end = Int(json_tokener_get_parse_end(tok)) }
            if let obj { json_object_put(obj) }
            json_tokener_free(tok)
        }
        // parse_end is the offending byte's offset (the column counts the bytes before it).
        let stop = max(0, min(end, bytes.count))
        var line = 1, column = 1
        for i in 0..<stop {
            if bytes[i] == 0x0A { line += 1; column = 1 } else if bytes[i] & 0xC0 != 0x80 { column += 1 }
        }
        return (line, column)
    }

    /// Resolves each enabled plugin's `exec` the way the host does (a path as given; a bare name
    /// in `pluginDir`, next to pylond, then on `PATH`) and names every one that is missing or not
    /// executable.
    public func executableProblems(
        selfDir: String? = System.executableDirectory(),
        path: String = System.env("PATH") ?? "/usr/bin:/bin"
    ) -> [String] {
        var problems: [String] = []
        for p in plugins where p.enabled {
            if p.exec.contains("/") {
                if access(p.exec, X_OK) != 0 {
                    problems.append("plugin \(p.name): \(p.exec) " + (access(p.exec, F_OK) == 0 ? "is not executable" : "does not exist"))
                }
                continue
            }
            var dirs: [String] = []
            if let d = pluginDir { dirs.append(d) }
            if let s = selfDir { dirs.append(s) }
            dirs += path.split(separator: ":").map(String.init)
            if !dirs.contains(where: { access($0 + "/" + p.exec, X_OK) == 0 }) {
                problems.append("plugin \(p.name): executable \(p.exec) not found (searched \(dirs.joined(separator: ":")))")
            }
        }
        return problems
    }
}
