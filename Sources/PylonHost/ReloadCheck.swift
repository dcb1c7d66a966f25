import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The plugins' own checks of a configuration a reload is about to apply, run on the host's loop:
/// every invocation (`HostConfig.pluginCheckInvocations`) is spawned at once with `uv_spawn`
/// (`ChildProcess`), its config written to its stdin and its output read by the loop, each
/// bounded by `HostConfig.pluginCheckTimeoutMs` (then killed; its config counts as not checked).
/// `done` runs once, on the loop, with what they said (`HostConfig.verdict`), after every check
/// exited and its output ended. Nothing blocks the loop meanwhile: the bus keeps routing.
final class PluginCheckRun {
    /// Output lines kept per check and stream; a check that says more is cut (it is counted as
    /// what it said up to there).
    static let maxLinesPerStream = 256
    static let maxLineBytes = 16 * 1024

    private final class Check {
        let invocation: HostConfig.PluginCheckInvocation
        var process: ChildProcess?
        var stdin: Connection?
        var stdout: Connection?
        var stderr: Connection?
        var out: [String] = []
        var err: [String] = []
        var status: Int32?
        var exited = false
        var timedOut = false
        var openStreams = 0
        var finished = false
        init(_ i: HostConfig.PluginCheckInvocation) { invocation = i }
    }

    private let loop: Loop
    private var checks: [Check] = []
    private var timer: Timer?
    private var done: ((HostConfig.PluginCheck) -> Void)?
    private var result = HostConfig.PluginCheck()

    init(loop: Loop, invocations: [HostConfig.PluginCheckInvocation], done: @escaping (HostConfig.PluginCheck) -> Void) {
        self.loop = loop
        self.done = done
        checks = invocations.map(Check.init)
        for c in checks { start(c) }
        if checks.contains(where: { !$0.finished }) {
            timer = loop.after(ms: HostConfig.pluginCheckTimeoutMs) { [weak self] in self?.timeUp() }
        }
        // Answered on a later turn even when nothing could be started (`done` never runs
        // inside `init`).
        loop.after(ms: 0) { [weak self] in self?.finishIfDone() }
    }

    /// Kills every check still running and drops the answer (the host is stopping).
    func cancel() {
        done = nil
        timer?.close()
        timer = nil
        for c in checks where !c.finished { abandon(c) }
    }

    private func start(_ c: Check) {
        let i = c.invocation
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else {
            failToStart(c, "cannot create a pipe: \(String(cString: strerror(errno)))")
            return
        }
        let (childIn, hostIn) = (fds[0], fds[1])
        _ = fcntl(hostIn, F_SETFD, FD_CLOEXEC)
        var o = ChildProcess.Options(exec: i.exec)
        o.args = i.args
        o.env = i.env
        o.inheritFds = [(child: 0, parent: childIn)]
        let out = Connection(loop: loop, maxLineBytes: Self.maxLineBytes)
        let err = Connection(loop: loop, maxLineBytes: Self.maxLineBytes)
        o.stdout = out
        o.stderr = err
        // The callbacks hold their check strongly: a cancelled run is gone before its killed
        // checks' exits and closes arrive (the handles drop the callbacks when they close).
        do throws(UVError) {
            c.process = try ChildProcess(loop: loop, options: o) { [weak self, c] status, signal in
                c.exited = true
                c.status = signal != 0 ? 128 + signal : Int32(truncatingIfNeeded: status)
                self?.finishIfDone(c)
            }
        } catch {
            System.close(childIn)
            System.close(hostIn)
            out.close()
            err.close()
            failToStart(c, "cannot run \(i.exec): \(error)")
            return
        }
        System.close(childIn)
        c.stdout = out
        c.stderr = err
        c.openStreams = 2
        for (stream, isErr) in [(out, false), (err, true)] {
            stream.onLine = { [c] line in
                let text = String(decoding: line, as: UTF8.self)
                if isErr {
                    if c.err.count < Self.maxLinesPerStream { c.err.append(text) }
                } else if c.out.count < Self.maxLinesPerStream {
                    c.out.append(text)
                }
            }
            stream.onClose = { [weak self, c] _ in
                c.openStreams -= 1
                self?.finishIfDone(c)
            }
            stream.startReading()
        }
        // The config is written by the loop as the pipe takes it; closing gives the check EOF.
        do throws(UVError) {
            let input = try Connection(loop: loop, fd: hostIn, maxLineBytes: Self.maxLineBytes)
            c.stdin = input
            i.input.withUnsafeBytes { input.sendLine($0) }
            input.closeAfterFlush()
        } catch {
            System.close(hostIn)  // the check reads EOF: an empty config
        }
    }

    private func failToStart(_ c: Check, _ why: String) {
        c.finished = true
        c.status = -1
        result.warnings.append("plugin \(c.invocation.plugin): \(why); its config is not checked")
    }

    private func timeUp() {
        timer = nil
        for c in checks where !c.finished {
            c.timedOut = true
            abandon(c)
            finishIfDone(c)
        }
    }

    /// Kills the check and stops reading its output (a child of it may hold the pipes open).
    private func abandon(_ c: Check) {
        c.process?.kill(SIGKILL)
        c.stdin?.close()
        c.stdout?.close()
        c.stderr?.close()
    }

    private func finishIfDone(_ c: Check) {
        guard !c.finished, c.exited, c.openStreams == 0 else { return }
        c.finished = true
        c.process = nil
        c.stdin = nil
        c.stdout = nil
        c.stderr = nil
        let status: Int32? = c.timedOut ? nil : c.status
        result.merge(HostConfig.verdict(plugin: c.invocation.plugin, status: status, stdout: c.out, stderr: c.err))
        finishIfDone()
    }

    private func finishIfDone() {
        guard checks.allSatisfy(\.finished), let cb = done else { return }
        done = nil
        timer?.close()
        timer = nil
        // In the order of the configuration, whatever order the checks ended in.
        let order = Dictionary(uniqueKeysWithValues: checks.enumerated().map { ($1.invocation.plugin, $0) })
        var r = result
        r.problems.sort { order[$0.plugin, default: 0] < order[$1.plugin, default: 0] }
        cb(r)
    }
}
