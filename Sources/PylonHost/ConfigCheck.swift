import CJSONC
import PylonCore
import PylonProtocol

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

    /// Where a bare plugin `exec` name is looked for, in order: `pluginDir`, the directory of
    /// pylond itself, then `path` (the host's `Bus.resolveExec` and `--check-config` alike).
    public func execSearchPath(selfDir: String?, path: String) -> [String] {
        [pluginDir, selfDir].compactMap { $0 } + path.split(separator: ":").map(String.init)
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
            let dirs = execSearchPath(selfDir: selfDir, path: path)
            if !dirs.contains(where: { access($0 + "/" + p.exec, X_OK) == 0 }) {
                problems.append("plugin \(p.name): executable \(p.exec) not found (searched \(dirs.joined(separator: ":")))")
            }
        }
        return problems
    }
}

/// `pylond --check-config` and every reload ask each enabled plugin to check its own `config`
/// with the reader it starts with: `EXEC ARGS… --check-config` with the config on stdin and no
/// bus channel (`Plugin.checkConfig` in the plugin kit; `Plugin.check_config` in Python).
/// `--check-config` runs them one after another (`pluginConfigChecks`, blocking: nothing else
/// runs then); a reload runs them on the host's loop (`PluginCheckRun`, ReloadCheck.swift).
/// Both build the same invocations and read the answers with the same rule (`verdict`).
extension HostConfig {
    /// One problem a plugin's check found (its reader's text, e.g. `config.endpoint: …`).
    public struct PluginProblem: Equatable, Sendable, CustomStringConvertible {
        public var plugin: String
        public var message: String
        public var description: String { "plugin \(plugin): \(message)" }
    }

    /// What the plugins' checks said.
    public struct PluginCheck: Equatable, Sendable {
        public var problems: [PluginProblem] = []
        /// Prefixed `plugin NAME: `.
        public var warnings: [String] = []

        public mutating func merge(_ other: PluginCheck) {
            problems += other.problems
            warnings += other.warnings
        }
    }

    /// How to run one plugin's check: its resolved executable, arguments, environment and the
    /// config it is given on stdin.
    public struct PluginCheckInvocation: Sendable {
        public var plugin: String
        public var exec: String
        public var args: [String]
        public var env: [String]
        public var input: [UInt8]
    }

    /// Longest a plugin may take to answer `--check-config`.
    public static let pluginCheckTimeoutMs: UInt64 = 5_000

    /// The check of every enabled plugin whose executable is found (one that is not is reported
    /// by `executableProblems`).
    public func pluginCheckInvocations(
        selfDir: String? = System.executableDirectory(), path: String = System.env("PATH") ?? "/usr/bin:/bin",
        environment: [String] = System.environment()
    ) -> [PluginCheckInvocation] {
        var out: [PluginCheckInvocation] = []
        for p in plugins where p.enabled && p.checkConfig {
            var exec = p.exec
            if !exec.contains("/") {
                let dirs = execSearchPath(selfDir: selfDir, path: path)
                guard let d = dirs.first(where: { access($0 + "/" + exec, X_OK) == 0 }) else { continue }
                exec = d + "/" + exec
            } else if access(exec, X_OK) != 0 {
                continue
            }
            var env = environment.filter { !$0.hasPrefix("PYLON_BUS_FD=") && !$0.hasPrefix("NOTIFY_SOCKET=") }
            env.append("PYLON_PLUGIN_NAME=" + p.name)
            for (k, v) in p.env.sorted(by: { $0.key < $1.key }) { env.append(k + "=" + v) }
            out.append(
                PluginCheckInvocation(
                    plugin: p.name, exec: exec, args: p.args + ["--check-config"], env: env, input: Array(p.config.serialized.utf8)))
        }
        return out
    }

    /// What one check's exit says: 0 accepted (its `warning: ` lines are warnings), 78 refused
    /// (each stderr line a problem), nil (no answer within `pluginCheckTimeoutMs`) or another
    /// status (the plugin cannot check: a warning, its config is not checked).
    public static func verdict(plugin: String, status: Int32?, stdout: [String], stderr: [String]) -> PluginCheck {
        var v = PluginCheck()
        let prefix = "plugin \(plugin): "
        switch status {
        case 0:
            v.warnings += stdout.filter { $0.hasPrefix("warning: ") }.map { prefix + $0.dropFirst(9) }
        case exitStatusConfigError:
            v.warnings += stdout.filter { $0.hasPrefix("warning: ") }.map { prefix + $0.dropFirst(9) }
            let lines = stderr.isEmpty ? ["the configuration is refused (exit 78)"] : stderr
            v.problems += lines.map { PluginProblem(plugin: plugin, message: $0) }
        case nil:
            v.warnings.append(prefix + "did not answer --check-config within \(pluginCheckTimeoutMs) ms; its config is not checked")
        case let s?:
            v.warnings.append(prefix + "--check-config exited \(s) (not supported?); its config is not checked")
        }
        return v
    }

    /// One note per enabled plugin configured with `"checkConfig": false`: it is not run with
    /// `--check-config`, so its settings are not checked before it starts.
    public var uncheckedPluginNotes: [String] {
        plugins.filter { $0.enabled && !$0.checkConfig }.map {
            "plugin \($0.name): not asked to check its config (\"checkConfig\": false); its settings are not checked before start"
        }
    }

    /// Runs every enabled plugin's check, one after another (blocking: `pylond --check-config`).
    public func pluginConfigChecks(selfDir: String? = System.executableDirectory()) -> PluginCheck {
        var all = PluginCheck()
        all.warnings += uncheckedPluginNotes
        for c in pluginCheckInvocations(selfDir: selfDir) {
            let r = Self.runCheck(c.exec, c.args, c.env, input: c.input)
            all.merge(Self.verdict(plugin: c.plugin, status: r.status, stdout: r.stdout, stderr: r.stderr))
        }
        return all
    }

    /// The 1-based line of the configuration text `text` where `problem` is best shown: the
    /// setting its message names (`config.KEY…` or `config: KEY …`) in that plugin's `config`,
    /// else the plugin's `config`, else its entry in `plugins`; nil when the entry is not found.
    public static func line(of problem: PluginProblem, in text: [UInt8]) -> Int? {
        text.withUnsafeBytes { t -> Int? in
            guard case .valid = RawJSON.validate(t, maxDepth: 1000) else { return nil }
            let root = RawJSON.skipSpace(t, 0)..<t.count
            guard let list = member(t, root, "plugins") else { return nil }
            for entry in RawJSON.Elements(t, list) {
                guard let n = member(t, entry, "name"), RawJSON.stringValue(t, n) == problem.plugin else { continue }
                guard let config = member(t, entry, "config") else { return lineNumber(t, entry.lowerBound) }
                if let key = settingName(problem.message), let v = member(t, config, key) { return lineNumber(t, v.lowerBound) }
                return lineNumber(t, config.lowerBound)
            }
            return nil
        }
    }

    /// The top-level setting a reader's message names: `config.KEY…: …` or `config: KEY …`.
    static func settingName(_ message: String) -> String? {
        let rest: Substring
        if message.hasPrefix("config.") {
            rest = message.dropFirst(7)
        } else if message.hasPrefix("config: ") {
            rest = message.dropFirst(8)
        } else {
            return nil
        }
        let key = rest.prefix { $0.isLetter || $0.isNumber || $0 == "_" || $0 == "-" }
        return key.isEmpty ? nil : String(key)
    }

    private static func member(_ t: UnsafeRawBufferPointer, _ span: Range<Int>, _ name: String) -> Range<Int>? {
        var name = name
        return name.withUTF8 { RawJSON.member(t, span, named: UnsafeRawBufferPointer($0)) }
    }

    private static func lineNumber(_ t: UnsafeRawBufferPointer, _ offset: Int) -> Int {
        1 + t[0..<offset].reduce(0) { $1 == 0x0A ? $0 + 1 : $0 }
    }

    /// The problems as `pylond --check-config` and a refused reload name them:
    /// `PATH:LINE: plugin NAME: MESSAGE` (`PATH: …` when the line is not found).
    public static func located(_ problems: [PluginProblem], path: String, text: [UInt8]) -> [String] {
        problems.map { p in
            if let l = line(of: p, in: text) { return "\(path):\(l): \(p)" }
            return "\(path): \(p)"
        }
    }

    /// Runs `exec` with `args`, `input` on stdin; its output lines. `status` nil: it did not
    /// exit within `pluginCheckTimeoutMs` (then it is killed).
    static func runCheck(_ exec: String, _ args: [String], _ env: [String], input: [UInt8]) -> (
        status: Int32?, stdout: [String], stderr: [String]
    ) {
        var inPipe: [Int32] = [0, 0], outPipe: [Int32] = [0, 0], errPipe: [Int32] = [0, 0]
        guard pipe(&inPipe) == 0, pipe(&outPipe) == 0, pipe(&errPipe) == 0 else {
            return (-1, [], ["cannot create pipes"])
        }
        // Only the child's ends (dup2'ed to 0, 1, 2) cross the exec.
        for fd in inPipe + outPipe + errPipe { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, inPipe[0], 0)
        posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2)
        defer { posix_spawn_file_actions_destroy(&actions) }
        let argv = ([exec] + args).map { strdup($0) } + [nil]
        let envp = env.map { strdup($0) } + [nil]
        defer {
            for a in argv { free(a) }
            for e in envp { free(e) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, exec, &actions, nil, argv, envp)
        close(inPipe[0])
        close(outPipe[1])
        close(errPipe[1])
        guard rc == 0 else {
            close(inPipe[1])
            close(outPipe[0])
            close(errPipe[0])
            return (-1, [], ["cannot run \(exec): \(String(cString: strerror(rc)))"])
        }
        // The config is small (it is part of pylon.json); the plugin reads it before writing.
        _ = input.withUnsafeBytes { write(inPipe[1], $0.baseAddress, $0.count) }
        close(inPipe[1])
        var out: [UInt8] = [], err: [UInt8] = []
        var fds = [pollfd(fd: outPipe[0], events: Int16(POLLIN), revents: 0), pollfd(fd: errPipe[0], events: Int16(POLLIN), revents: 0)]
        let deadline = (Loop.hrtimeNs / 1_000_000) + pluginCheckTimeoutMs
        var open = 2
        var buf = [UInt8](repeating: 0, count: 4096)
        while open > 0 {
            let now = (Loop.hrtimeNs / 1_000_000)
            guard now < deadline else { break }
            if poll(&fds, 2, Int32(deadline - now)) <= 0 { continue }
            for i in 0..<2 where fds[i].fd >= 0 && fds[i].revents != 0 {
                let n = buf.withUnsafeMutableBytes { read(fds[i].fd, $0.baseAddress, $0.count) }
                if n > 0, out.count + err.count < 1 << 20 {
                    if i == 0 { out += buf[0..<n] } else { err += buf[0..<n] }
                } else if n <= 0 {
                    close(fds[i].fd)
                    fds[i].fd = -1
                    open -= 1
                }
            }
        }
        for f in fds where f.fd >= 0 { close(f.fd) }
        var status: Int32 = 0
        var exited = false
        while (Loop.hrtimeNs / 1_000_000) < deadline {
            let w = waitpid(pid, &status, WNOHANG)
            if w == pid { exited = true; break }
            if w < 0 { break }
            usleep(10_000)
        }
        if !exited {
            kill(pid, SIGKILL)
            waitpid(pid, &status, 0)
            return (nil, [], [])
        }
        func lines(_ b: [UInt8]) -> [String] { String(decoding: b, as: UTF8.self).split(separator: "\n").map(String.init) }
        let code: Int32 = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        return (code, lines(out), lines(err))
    }
}
