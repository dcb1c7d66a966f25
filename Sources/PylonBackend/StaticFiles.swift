import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The console's files (`--console-dir`), read once at start into memory: a request can name
/// only a file that was found under the directory then, so no path a client sends reaches the
/// filesystem (no `..`, no symlink escape, no directory listing), and serving never blocks the
/// loop on a disk read. A changed file is served after a restart.
///
/// Loaded: regular files, and symlinks whose target is a regular file under the directory or
/// under `allowedLinkRoots` (Debian's `/usr/share/javascript`, where `libjs-chart.js` lives);
/// names starting with `.` are skipped. Bounded by `ConsoleLimits.maxFiles`,
/// `maxFileBytes`, `maxTotalBytes` and `maxDepth`; over a bound the backend does not start.
package struct StaticFiles: Sendable {
    package struct File: Sendable {
        var contentType: String
        var bytes: [UInt8]
    }
    private(set) var files: [String: File] = [:]
    package var count: Int { files.count }
    package var totalBytes: Int { files.values.reduce(0) { $0 + $1.bytes.count } }

    static let allowedLinkRoots = ["/usr/share/javascript/"]

    package struct Failure: Error, CustomStringConvertible { package let description: String }

    /// Reads every file under `dir`.
    package static func load(_ dir: String) -> Result<StaticFiles, Failure> {
        guard let rootC = realpath(dir, nil) else { return .failure(Failure(description: "\(dir): \(String(cString: strerror(errno)))")) }
        let root = String(cString: rootC)
        free(rootC)
        var out = StaticFiles()
        var total = 0
        func walk(_ rel: String, depth: Int) -> Failure? {
            guard depth <= ConsoleLimits.maxDepth else {
                return Failure(description: "\(dir): deeper than \(ConsoleLimits.maxDepth) levels")
            }
            let abs = rel.isEmpty ? root : root + "/" + rel
            guard let d = opendir(abs) else { return Failure(description: "\(abs): \(String(cString: strerror(errno)))") }
            defer { closedir(d) }
            var names: [String] = []
            while let e = readdir(d) {
                let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if name.hasPrefix(".") { continue }
                names.append(name)
            }
            for name in names.sorted() {
                let r = rel.isEmpty ? name : rel + "/" + name
                let path = root + "/" + r
                var st = stat()
                guard lstat(path, &st) == 0 else { continue }
                let kind = st.st_mode & S_IFMT
                if kind == S_IFDIR {
                    if let f = walk(r, depth: depth + 1) { return f }
                    continue
                }
                if kind == S_IFLNK {
                    guard let t = realpath(path, nil) else { continue }
                    let target = String(cString: t)
                    free(t)
                    guard target.hasPrefix(root + "/") || allowedLinkRoots.contains(where: target.hasPrefix),
                        stat(target, &st) == 0, st.st_mode & S_IFMT == S_IFREG
                    else { continue }
                } else if kind != S_IFREG {
                    continue
                }
                guard out.files.count < ConsoleLimits.maxFiles else {
                    return Failure(description: "\(dir): more than \(ConsoleLimits.maxFiles) files")
                }
                guard Int(st.st_size) <= ConsoleLimits.maxFileBytes, let bytes = System.readFile(path, limit: ConsoleLimits.maxFileBytes)
                else { return Failure(description: "\(path): unreadable or larger than \(ConsoleLimits.maxFileBytes) bytes") }
                total += bytes.count
                guard total <= ConsoleLimits.maxTotalBytes else {
                    return Failure(description: "\(dir): more than \(ConsoleLimits.maxTotalBytes) bytes")
                }
                out.files[r] = File(contentType: contentType(r), bytes: bytes)
            }
            return nil
        }
        if let f = walk("", depth: 0) { return .failure(f) }
        return .success(out)
    }

    /// The file a request path (relative, decoded, without the leading `/`) names: `""` and a
    /// path ending in `/` name its `index.html`, as does a directory's name. Nil for anything
    /// else, and for a path with an empty, `.` or `..` segment.
    func lookup(_ path: String) -> File? {
        var p = path
        if p.isEmpty || p.hasSuffix("/") { p += "index.html" }
        let segs = p.split(separator: "/", omittingEmptySubsequences: false)
        guard !segs.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." || $0.utf8.contains(0) }) else { return nil }
        return files[p] ?? files[p + "/index.html"]
    }

    static func contentType(_ name: String) -> String {
        let ext = name.split(separator: ".").last.map { $0.lowercased() } ?? ""
        switch ext {
        case "html", "htm": return "text/html; charset=utf-8"
        case "css": return "text/css; charset=utf-8"
        case "js", "mjs": return "text/javascript; charset=utf-8"
        case "json", "map": return "application/json"
        case "svg": return "image/svg+xml"
        case "png": return "image/png"
        case "ico": return "image/x-icon"
        case "txt": return "text/plain; charset=utf-8"
        case "woff2": return "font/woff2"
        default: return "application/octet-stream"
        }
    }
}
