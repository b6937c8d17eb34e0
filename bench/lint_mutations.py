"""Take each inference of the lint's analysis out in turn and check that a test fails
(every inference the analysis makes needs a test that fails without it).

    python bench/lint_mutations.py        # from the repository root; restores every file
    python bench/lint_mutations.py zoo    # only the entries whose name holds one of the words

Each entry: a name, the file under src/ddpguard/lint/ (analysis/... or rules/ddpNNN_...), the
text of the inference, and what replaces it. KILLED means some lint test failed without it.
"""

# ruff: noqa: E501  (a table of source snippets: each entry stays on one line)
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
L = str(ROOT / "src/ddpguard/lint") + "/"
M = [
 ("flag provenance", "analysis/ranks.py", "    if ranked:\n", "    if ranked and False:\n"),
 ("designated rank", "analysis/ranks.py", "    return d is not None and d.rsplit(\".\", 1)[-1].lower() in _DESIGNATED", "    return False"),
 ("yield split", "analysis/sequences.py", "    return tuple(i for i in seq if i.ev is None or i.ev.kind != \"yield\")", "    return seq"),
 ("launch mode", "analysis/ranks.py", "    if node is None:\n        return UNKNOWN\n    if isinstance(node, ast.Constant):", "    return UNKNOWN\n    if isinstance(node, ast.Constant):"),
 ("per-rank path via assignment", "analysis/paths.py", "        if depth < 2 and any(per_rank_path", "        if depth < 0 and any(per_rank_path"),
 ("per-rank loop var", "analysis/paths.py", " or d in _rank_loop_vars(info):", ":"),
 ("callee resolution", "analysis/callgraph.py", "    fns = info.local_callees(rec)\n    if len(fns) > 1", "    return None\n    fns = info.local_callees(rec)\n    if len(fns) > 1"),
 ("parameter forward binding", "analysis/projection.py", "            if b is None:\n                continue", "            if True:\n                continue"),
 ("call alignment by callee", "analysis/divergence.py", "    return (\"call\", it.name, it.key[3]) if it.kind == \"call\" else (it.kind, it.site)", "    return (it.kind, it.site)"),
 ("DDP016 early return guard", "rules/ddp016_reduce_read_on_all_ranks.py", "                guard = guard or level  #", "                pass  #"),
 ("callee exits not caller's", "analysis/sequences.py", "        if it.kind != \"call\":\n            for arm in it.arms:\n                hit = _early_exit(", "        if True:\n            for arm in it.arms:\n                hit = _early_exit("),
 ("padded shards", "rules/ddp003_uneven_manual_shard.py", "            if \"pad\" in name.lower():\n                return True", "            pass"),
 ("validation sampler", "rules/ddp001_missing_set_epoch.py", "    return not any(h in name for h in _EVAL)", "    return True"),
 ("one-process group", "rules/ddp012_missing_destroy.py", "    return (isinstance(ws, ast.Constant) and ws.value == 1) or (", "    return False and (isinstance(ws, ast.Constant) and ws.value == 1) or ("),
 ("guarded load", "rules/ddp010_unsafe_torch_load.py", "                and not info.effective_guard(rec) \\\n", ""),
 ("cross-file", "analysis/crossfile.py", "        module, _, name = qual.rpartition(\".\")\n", "        return None\n        module, _, name = qual.rpartition(\".\")\n"),
 ("same-contents pickle", "analysis/schedule.py", "            if not any(rank_dependent(self.info, o) for o in obj):\n                return None", "            pass"),
 ("BOM strip", "analysis/source.py", "    if source.startswith(\"\\ufeff\"):  # a str", "    if False:  # a str"),
 ("continue in an inner loop", "analysis/sequences.py", ' and not (in_loop and it.ev.op in ("continue", "break"))', ''),
 ("rank % a per-node count", "analysis/ranks.py", 'if any(h in name for h in ("gpu", "per_node", "local", "device_count", "nproc")):', 'if True:'),
 ("predicate by its shape", "analysis/provenance.py", "return low in _PREDICATES or bool(_PREDICATE_RE.match(low))", "return low in _PREDICATES"),
 ("own definition wins", "analysis/ranks.py", "fns = info.funcs.get(last, [])  # this file's own definition wins over the name", "fns = []"),
 ("cross-file within its tree", "analysis/crossfile.py", "\n                     if m is not caller and (k > 1 or self._same_tree(m, caller))]", "\n                     if m is not caller]"),
 ("dotted import across top folders", "analysis/crossfile.py", "\n                     if m is not caller and (k > 1 or self._same_tree(m, caller))]", "\n                     if m is not caller and self._same_tree(m, caller)]"),
 ("BOM decode", "analysis/source.py", "        text = data.decode(encoding)", "        text = data.decode(\"utf-8\")"),
 ("same ops through other lines (replace)", "analysis/divergence.py", "    if (ea is None and eb is None) or ops(a) == ops(b):", "    if ea is None and eb is None:"),
 ("same ops in the whole sequence", "analysis/divergence.py", "            if found and ops(sa) == ops(sb):", "            if False:"),
 ("narrowing asserts", "analysis/schedule.py", "            elif not _narrowing(s.test):", "            elif True:"),
 ("reduced value read in the callee", "rules/ddp016_reduce_read_on_all_ranks.py", "        reads = [(n, g) for n, g in reads if id(n) not in passed\n                 or _callee_reads(info, *passed[id(n)])]", "        pass"),
 ("builtins read their argument", "rules/ddp016_reduce_read_on_all_ranks.py", "    if rec.last in _READERS and rec.qual in (None, rec.last):\n        return True", "    pass"),
 ("split into a world multiple", "rules/ddp003_uneven_manual_shard.py", "    if any(_split_into_world_multiple(info, v) for v in values):\n        return True", "    pass"),
 ("a predicate call is a test, not the rank", "analysis/ranks.py", "    if isinstance(node, ast.Call) and _tests_rank(info, info.callee_last(node)):\n        return None", "    pass"),
 ("exit and collective behind one flag", "analysis/divergence.py", "    if not site:\n        return False", "    if True:\n        return False"),
 ("report where the classes part, past a shared start", "analysis/divergence.py", "    if k:\n        ea = la[k][1]", "    if False:\n        ea = la[k][1]"),
 ("paddle's DataParallel is not torch's", "rules/ddp014_data_parallel.py", "        if rec.last == \"DataParallel\" and not (rec.qual", "        if rec.last == \"DataParallel\" and True or not (rec.qual"),
 ("set_device in another file", "rules/ddp015_ddp_device_placement.py", "    if getattr(info.file_set, \"sets_device\", False) and not set_devices:", "    if False:"),
 ("shard sized by len // world", "rules/ddp003_uneven_manual_shard.py", "                    and not _counts_the_remainder(info, node) \\\n", "                    and True \\\n"),
 ("share padded from itself", "rules/ddp003_uneven_manual_shard.py", "                    and not _padded_in_place(info, node):", "                    and True:"),
 ("share length asserted", "rules/ddp003_uneven_manual_shard.py", "                    dotted(c.args[0]) == seq for c in ast.walk(n.test.left)):", "                    False for c in ast.walk(n.test.left)):"),
 ("results stored by sample index", "rules/ddp020_padded_eval_sampler.py", "        if not (rec.func is not None and id(rec.func) in keyed or reducing and\n                reducing <= keyed):", "        if True:"),
 ("results stored through an index subscript", "rules/ddp020_padded_eval_sampler.py", "                isinstance(t, ast.Subscript) and _index_like(t.slice) for t in n.targets)", "                False for t in n.targets)"),
 ("the bare model saved in the mode that never wraps", "rules/ddp008_save_ddp_state_dict.py", "                if _unwrapped_here(info, owner, node) or", "                if False or"),
 ("negated mode test", "rules/ddp008_save_ddp_state_dict.py", "                    test, neg = test.operand, not neg", "                    break"),
 ("the load reads this model back", "rules/ddp008_save_ddp_state_dict.py", "                    k is not None or _load_owner(ld) in names)), None)", "                    True)), None)"),
 ("enumerate's index is no batch", "rules/ddp004_rank_dependent_step_count.py", "            target = target.elts[1]  #", "            pass  #"),
 ("a move inside the wrap's arguments", "rules/ddp015_ddp_device_placement.py", "dominates(w, rec) and not _within(rec.node, w.node)", "dominates(w, rec)"),
 ("uncalled helper writing through another", "rules/ddp007_shared_file_write.py", "            if root is not None:\n                # A helper nobody", "            if root is not None and not via:\n                # A helper nobody"),
 ("exclusive flag through a helper", "analysis/divergence.py", "partners.append((nx.line, via[0] if via else nx.line, (", "partners.append((nx.line, 0 if via else nx.line, ("),
 ("the first partner the exit does abandon", "analysis/divergence.py", "                for line, site, message in d.partners or (", "                for line, site, message in d.partners[:1] or ("),
 ("rank= of init_process_group", "analysis/walker.py", "                        d = dotted(k.value) if k.arg == \"rank\" else None", "                        d = None"),
 ("the same move again is a no-op", "rules/ddp015_ddp_device_placement.py", "                                    and not _moved_there_before(info, rec, w)\n", ""),
 ("DDP join handles uneven shards", "analysis/crossfile.py", "    return info.joins or any(", "    return False and any("),
 ("a test the same on every rank, decided", "analysis/schedule.py", "fixed = UNKNOWN if split else evaluate_test(self.info, s.test, RANK0)", "fixed = UNKNOWN if split else __import__(\"ddpguard.lint.analysis.ranks\", fromlist=[\"launch\"]).launch(self.info, s.test)"),
 ("literal arguments decide the callee's tests", "analysis/projection.py", "            if consts and v == UNKNOWN:", "            if False:"),
 ("a left-out parameter takes its default", "analysis/schedule.py", "            if name in tested and name not in given:\n                if isinstance(d, ast.Constant):", "            if False:\n                if isinstance(d, ast.Constant):"),
 ("a literal through the caller's parameter", "analysis/schedule.py", "            elif isinstance(arg, ast.Name) and arg.id in self.params:", "            elif False:"),
 ("parameters passed on count as read", "analysis/statements.py", "            elif isinstance(st, ast.Call):", "            elif False:"),
 ("a local name holds the wrapper only where wrapped", "analysis/schedule.py", "            if w.func is None or (here is not None and", "            if True or (here is not None and"),
 ("a parameter the function wraps itself", "analysis/schedule.py", "            if w.func is here:\n                return True", "            if False:\n                return True"),
 ("DDP017 once per guarded block", "rules/ddp017_local_rank_zero_writes.py", "        if block in seen:\n            continue", "        if False:\n            continue"),
 ("DDP017 a guarded save is reported where it is", "rules/ddp017_local_rank_zero_writes.py", "                if rec.guard == LOCAL:\n                    continue", "                if False:\n                    continue"),
 ("no_sync bound to a name", "analysis/walker.py", "                    elif attr == \"no_sync\":", "                    elif False:"),
 ("the arm beside a GPU wrap is the CPU path", "rules/ddp015_ddp_device_placement.py", "    if any(kwarg(w.node, \"device_ids\") is not None and exclusive(w, wrap)", "    if False and any(kwarg(w.node, \"device_ids\") is not None and exclusive(w, wrap)"),
 ("a constant test is decided", "analysis/ranks.py", "    if isinstance(node, ast.Constant):  # `if False and", "    if False:  # `if False and"),
 ("a stub is no exit to report", "analysis/schedule.py", "STUB if _stub(s.exc) else \"raise\"", "\"raise\""),
 ("an assert a distributed run fails ends it", "analysis/schedule.py", "            if not splits(self.info, s.test) and \\\n", "            if False and \\\n"),
 ("a memoised callee is unknown", "analysis/schedule.py", "        if target_fn is None or _memoised(target_fn[1]) or \\\n", "        if target_fn is None or \\\n"),
 ("a leader-only decorator", "analysis/schedule.py", "        level = rank_only(target_fn[1])\n        if level:", "        level = rank_only(target_fn[1])\n        if False:"),
 ("a per-rank path passed by the caller", "analysis/projection.py", "per_rank or bool(ev.names & n.per_rank)", "per_rank"),
 ("asserts are DDP022, not DDP019", "analysis/divergence.py", "code = \"DDP022\" if ex.kind == \"mayexit\" or ex.op == \"raise\" else \"DDP019\"", "code = \"DDP022\" if ex.op == \"raise\" else \"DDP019\""),
 ("a sampler reseeded each epoch", "rules/ddp001_missing_set_epoch.py", "                and not _reseeded_in(loop, sampler) and", "                and"),
 ("a set_epoch in a hook the loop calls", "rules/ddp001_missing_set_epoch.py", "    return bool(names) and any(rec.last in names and loop in rec.loops for rec in info.calls)", "    return False"),
 ("a step after every backward is no accumulation", "rules/ddp013_accumulation_without_no_sync.py", "    return any(r.last == \"backward\" for r in outside) and \\\n        not any(is_optimizer_step(r.node) for r in outside)", "    return True"),
 ("a no_grad forward pairs with the others' next forward", "analysis/divergence.py", "    if code == \"DDP006\" and _no_grad(a, it) and", "    if False and _no_grad(a, it) and"),
 ("the next iteration's forward", "analysis/divergence.py", " or \\\n            _first(then_b, _OPS)", ""),
 ("no_grad through the call path", "analysis/sequences.py", "                return it.no_grad or _no_grad(arm, target)", "                return _no_grad(arm, target)"),
 ("a helper called in both arms pairs", "analysis/divergence.py", "        return x.name == y.name and x.args == y.args", "        return x.name == y.name and x.site == y.site"),
 ("literal arguments keep calls apart", "analysis/divergence.py", "        return x.name == y.name and x.args == y.args", "        return x.name == y.name"),
 ("pairs at the start of a changed stretch", "analysis/divergence.py", "        while i1 < i2 and j1 < j2 and _pairable(sa[i1], sb[j1]):", "        while False:"),
 ("a resume that strips module.", "rules/ddp008_save_ddp_state_dict.py", "    if not ddp or _strips_prefix(info):", "    if not ddp:"),
 ("the unwrapped arm of a wrap test", "rules/ddp008_save_ddp_state_dict.py", " or _wrap_tested(root, node):", ":"),
 ("truncated gathers drop the padding", "rules/ddp020_padded_eval_sampler.py", "            or isinstance(n, ast.Subscript) and _cut_to_length(n.slice)\n", "\n"),
 ("self.model wrapped in another method", "analysis/schedule.py", "            if root in (\"self\", \"cls\"):", "            if False:"),
 ("an attribute of self known on the path", "analysis/projection.py", "            fact = _fact(n.test) if not split else None", "            fact = None"),
 ("facts passed to methods of self", "analysis/projection.py", "    if n.via_self:\n", "    if False:\n"),
 ("a method of an instance of this file's class", "analysis/context.py", "            return self.instance_methods(rec) if self.classes else []", "            return []"),
 ("an instance method's call site guards it", "analysis/rank_functions.py", "                info.instance_methods(rec) if rec.callee == \"\" and info.classes else ():", "                ():"),
 ("a rank read from a config by key", "analysis/provenance.py", "    return env_level(key) or (name_level(key) if key.islower() else NONE)", "    return env_level(key)"),
 ("a single-process flag is false in a distributed run", "analysis/ranks.py", "    if d is not None and _SINGLE_NAME.search(d.rsplit(\".\", 1)[-1]):\n        return FALSE", "    pass"),
 ("writes under an undecided rank test are not proven", "analysis/projection.py", "            if split and not unproven:", "            if False:"),
 ("is_root predicates", "analysis/provenance.py", "leader|root|rank_?0", "leader|rank_?0"),
 ("apex's DistributedDataParallel is not torch's", "analysis/context.py", "        return (last == \"DistributedDataParallel\" or last.endswith(\"_DDP\")) and \\\n            not foreign_ddp(self.qualify(node.func))", "        return last == \"DistributedDataParallel\" or last.endswith(\"_DDP\")"),
 ("a launch flag compared with True", "analysis/ranks.py", "        v = launch(info, node.left)\n", "        return UNKNOWN\n"),
 ("a parallel flag is the launch mode", "analysis/ranks.py", "is_ddp|parallel|", "is_ddp|"),
 ("an NCCL variable in prose is no setting", "analysis/nccl.py", "        if m and (text.strip() == m.group(0) or text[m.end():m.end() + 1] == \"=\"):", "        if m:"),
 ("a sampler that moves its own epoch", "rules/ddp001_missing_set_epoch.py", "    if info is not None and (_advances_itself(info, info.callee_last(s)) or any(", "    if info is not None and (False or any("),
 ("hvd.rank() is the rank", "analysis/provenance.py", "\"get_node_local_rank\": LOCAL, \"rank\": GLOBAL,", "\"get_node_local_rank\": LOCAL,"),
 ("a break leaves the loop the others go on with", "analysis/divergence.py", "            later = _colls(then) if ex.op == \"break\" else []", "            later = []"),
 ("a write in another file is reported at this file's call", "rules/ddp007_shared_file_write.py", "            if ev.path and ev.path != info.path and via:", "            if False:"),
 ("a master field is the leader flag", "analysis/provenance.py", "\"is_rank_0\",\n               \"master\"}", "\"is_rank_0\"}"),
 ("a sampler chosen by a conditional expression", "analysis/context.py", "        if isinstance(node, ast.IfExp):\n            # `RandomSampler(d)", "        if False:\n            # `RandomSampler(d)"),
 ("a loader behind a progress bar of another name", "analysis/context.py", "            elif last in _UNWRAP and v.args:  # `bar = tqdm(train_loader)`", "            elif False:"),
 ("loaders assigned as a tuple", "analysis/walker.py", "            if type(value) is ast.Tuple and any(type(g) is ast.Tuple for g in targets):", "            if False:"),
 ("names resolve in the loop's own function first", "rules/ddp001_missing_set_epoch.py", "        local = [v for line, v in info.assigns.get(node.id, [])\n                 if fn.lineno <= line <= (fn.end_lineno or fn.lineno)]", "        local = []"),
 ("an evaluation sampler by its name", "rules/ddp001_missing_set_epoch.py", " or any(\n            h in name.lower() for name in _names_of(info, s) for h in _EVAL)):", "):"),
 ("a module function as a truth value", "analysis/ranks.py", "    if isinstance(node, ast.Name) and _module_function(info, node.id):", "    if False:"),
 ("a gpu switch is no rank", "analysis/ranks.py", "    if \"rank\" not in last.lower() and d not in info.rank_names:", "    if False:"),
 ("a mesh coordinate is no rank", "analysis/provenance.py", "            if type(f) is _Attribute and (type(f.value) is ast.Subscript or \"mesh\" in (", "            if False and (type(f.value) is ast.Subscript or \"mesh\" in ("),
 ("template folders are skipped", "engine.py", "                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and \"{{\" not in d)", "                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)"),
 ("NCCL_TIMEOUT apart from deprecated names", "rules/ddp011_bad_nccl_variable.py", "        if name == \"TIMEOUT\":", "        if True:"),
 ("a literal rank argument decides the callee's rank tests", "analysis/projection.py", "            if consts and split and _decided_by_consts(n.test, consts):", "            if False:"),
 ("a negative literal is a literal", "analysis/schedule.py", "            elif lit is not None:\n                out[name] = lit", "            elif False:\n                out[name] = lit"),
 ("a literal in a list test", "analysis/projection.py", "        if isinstance(op, ast.In | ast.NotIn) and isinstance(items, tuple):", "        if False:"),
 ("a negative literal default", "analysis/schedule.py", "                elif (lit := _const(d)) is not None:  # `rank=-1`", "                elif False:  # `rank=-1`"),
 ("a rank flag passed to a constructor", "analysis/crossfile.py", "        _constructor_flags(infos)\n", "\n"),
 ("a module function is referenced by its bare name", "rules/ddp007_shared_file_write.py", "                names = used[0] if root in info.func_class else used[1]", "                names = used[0]"),
 ("a variable of that name is no reference", "rules/ddp007_shared_file_write.py", "                if isinstance(a, ast.Name) and a.id not in params and a.id not in info.assigns:", "                if isinstance(a, ast.Name):"),
 ("a rank flag set in another file", "analysis/crossfile.py", "                if \".\" in name:\n                    shared.setdefault", "                if False:\n                    shared.setdefault"),
 ("worker loop on a received signal", "analysis/divergence.py", "if not has_split(info, root) or message_loop(info, root) or", "if not has_split(info, root) or False or"),
 ("closure handed away under rank tests", "analysis/divergence.py", "root is not None and handed_away_under_rank_tests(info, root)):", "False):"),
 ("closure reference in the single-process arm", "analysis/callgraph.py", "            if v != TRUE:\n                _refs(info, s.orelse, name, inner, out)", "            _refs(info, s.orelse, name, inner, out)"),
 ("a tool that forms no group", "rules/ddp007_shared_file_write.py", "    if not info.distributed or not (runs_as_a_group(info) or (", "    if not info.distributed or not (True or ("),
 ("a module imported by a group's file", "rules/ddp007_shared_file_write.py", "            info.file_set is not None and info.file_set.in_group(info))):", "            False)):"),
 ("plain imports join the group", "analysis/crossfile.py", "for qual in set(caller.aliases.values()) | plain:", "for qual in set(caller.aliases.values()):"),
 ("a subcommand that forms no group", "rules/ddp007_shared_file_write.py", "            if mode_without_group(info, lines) or (", "            if False or ("),
 ("a group set up through this file's functions", "analysis/callgraph.py", "                    and any(id(fn) in out for fn in info.local_callees(rec))}", "                    and False}"),
 ("buffer broadcast set from a config", "rules/ddp006_ddp_forward_divergence.py", "    if found and _buffers_maybe_unsynced(info):", "    if False:"),
 ("a tuple literal is no caller parameter", "analysis/projection.py", "        if isinstance(val, CallerParam):", "        if isinstance(val, CallerParam | tuple):"),
 ("a bare .cuda() in sight", "rules/ddp015_ddp_device_placement.py", "                _bare_cuda(info, rec) and not _placed_per_rank(", "                not _placed_per_rank("),
 ("pair the events of the same line", "analysis/divergence.py", "        if i2 - i1 + j2 - j1 == 1:\n            i1, i2, j1, j2 = _slide(", "        if False:\n            i1, i2, j1, j2 = _slide("),
 ("a while loop's continue that comes back", "analysis/divergence.py", "            if ex.op == \"continue\" and ex.text == \"while\" and _retry(", "            if False and _retry("),
 ("work handed to a thread under a rank test", "analysis/divergence.py", "                hands_work_away(info, root) or (", "                False or ("),
 ("rank functions known before the walk", "analysis/walker.py", "    _rank_functions_first(info, tree.body)\n", ""),
 ("the look-ahead's cache read again", "analysis/walker.py", "    info._memo.clear()\n    info._last.clear()\n    walker.block", "    walker.block"),
 ("a loader on an instance of this file's class", "analysis/context.py", "        if isinstance(node, ast.Attribute) and f\"self.{node.attr}\" in self.assigns and any(", "        if False and any("),
 ("a dump on the way out", "rules/ddp007_shared_file_write.py", "(ev.path or info.path) == info.path and _dump_on_the_way_out(info, ev.line)):", "False):"),
 ("same collectives on every path of a flag", "analysis/divergence.py", "            if found and paths_agree(sa, sb):", "            if False:"),
 ("a break on the path ends the loop", "analysis/consistent.py", "got = [(\"loop\", it.site, tuple(body), end)] if body else []", "got = [(\"loop\", it.site, tuple(body), \"\")] if body else []"),
 ("is_first_worker", "analysis/provenance.py", "r\"first_(worker|rank|process|proc|gpu|device)|\"", "r\"first_(xworker)|\""),
 ("n_gpu set to one", "analysis/ranks.py", "    return any(isinstance(v, ast.Constant) and v.value == 1 for _, v in info.assigns.get(d, ()))", "    return False"),
 ("not param passed on", "analysis/schedule.py", "                out[name] = CallerParam(arg.operand.id, negate=True)", "                pass"),
 ("not param is read", "analysis/statements.py", "                        a = a.operand  # `is_training=not evaluate`", "                        pass"),
 ("a method reached only from uncalled methods", "rules/ddp007_shared_file_write.py", "                if root.name not in names or (root in info.func_class and\n                                              not _live_method_call(info, root.name, called)):", "                if root.name not in names:"),
 ("liveness through methods a live call reaches", "rules/ddp007_shared_file_write.py", "        more = {n for n, here, m in sites if not here and m in live} - live", "        more: set[str] = set()"),
 ("a flag set to constants in a rank test's arms", "analysis/walker.py", "            if level:\n                _flags_set_in_arms(info, s, level)\n", ""),
 ("torch.save is no call of a method", "rules/ddp007_shared_file_write.py", "                    (dotted(f.value) or \"\").split(\".\", 1)[0] in modules:", "                    False:"),
 ("a skipped batch matters only in a loop that syncs", "rules/ddp004_rank_dependent_step_count.py", " or not _steps_together(info, node):", ":"),
 ("a skipped batch: the backward in a helper", "rules/ddp004_rank_dependent_step_count.py", "            for fn in info.local_callees(rec) if depth < 2 else ():", "            for fn in ():"),
 ("a visibly buffer-free model", "rules/ddp006_ddp_forward_divergence.py", "            and wrapped_model_has_no_buffers(info):", "            and False:"),
 ("model zoos have buffers", "analysis/buffers.py", "        if qual.startswith(_ZOOS):\n            return False\n", ""),
 ("layers of unknown packages may have buffers", "analysis/buffers.py", " and not qual.startswith(_KNOWN)", ""),
 ("a norm layer with running statistics", "analysis/buffers.py", "        if \"Norm\" in last and not last.endswith(_NO_BUFFER_NORMS):\n            return False\n", ""),
 ("a model not built from this file's class", "analysis/buffers.py", "    return _class_without_buffers(info, value.func.id, set())", "    return True"),
 ("data reshuffled in the epoch loop", "rules/ddp001_missing_set_epoch.py", "and is_true(kwarg(n.value, \"shuffle\"))", ""),
 ("the DDP wrap in another mode", "rules/ddp013_accumulation_without_no_sync.py", "                and not _wrapped_only_in_another_mode(info, rec.node):", "                and True:"),
 ("a mode flag's negation", "rules/ddp013_accumulation_without_no_sync.py", "                test, on = test.operand, not on", "                test, on = test.operand, on"),
 ("a search's fallback is run-time data", "analysis/divergence.py", "            if found and (marked(sa) or marked(sb)) and \\\n", "            if False and \\\n"),
 ("a search's fallback: a placeholder set first", "analysis/runtime_tests.py", "    return len(sets) >= 2 and isinstance(sets[0], ast.Constant)", "    return True or len(sets) >= 2 and isinstance(sets[0], ast.Constant)"),
 ("a loop without collectives is nothing to the others", "analysis/consistent.py", "] if body else []", "]"),
 ("a script that never forms a group", "rules/ddp001_missing_set_epoch.py", "    hits = list(_ddp001(info))\n    if hits and not _never_forms_a_group(info):\n", "    hits = list(_ddp001(info))\n    if hits:\n"),
 ("a set-up helper may form the group", "rules/ddp001_missing_set_epoch.py", "        if _MAY_FORM.search(last):\n            return False\n", ""),
 ("only a script is known not to form a group", "rules/ddp001_missing_set_epoch.py", "    if not info.has_main:\n        return False\n    for name in info.call_lasts():", "    for name in info.call_lasts():"),
 ("a collate_fn's filter keeps the step count", "rules/ddp004_rank_dependent_step_count.py", "    for node in ast.walk(fn):\n        if isinstance(node, ast.Return) and (", "    for node in ast.walk(fn):\n        if isinstance(node, ast.ListComp):\n            return node\n        if isinstance(node, ast.Return) and ("),
 ("a DataLoader worker is no rank", "analysis/schedule.py", "                    fixed = in_a_rank(s.test)", "                    pass"),
 ("a worker test's polarity", "analysis/runtime_tests.py", "    return TRUE if value != neg else FALSE", "    return TRUE"),
 ("a value a collective delivered", "analysis/schedule.py", "                               not split and received(self.info, self.func, s.test)))", "                               False))"),
 ("a received value through an assignment", "analysis/runtime_tests.py", "            if depth < 2 and isinstance(n, ast.Name) and any(", "            if False and any("),
 ("a loop over datasets is no epoch loop", "rules/ddp001_missing_set_epoch.py", " and not _per_dataset(loop, sampler) \\\n", " \\\n"),
 ("a bound method handed away", "analysis/callgraph.py", "                a.attr if isinstance(a, ast.Attribute) else None", "                None"),
 ("a feature-extraction loop needs no set_epoch", "rules/ddp001_missing_set_epoch.py", " and not _extracts_only(info, lrec):", ":"),
 ("a stepping loop is no extraction", "rules/ddp001_missing_set_epoch.py", "    if id(loop) in stepping:\n        return False\n", ""),
 ("the rank within a subgroup", "analysis/provenance.py", "            if last == \"get_rank\" and _in_a_group(n):", "            if False:"),
 ("a save and a load of different files", "rules/ddp008_save_ddp_state_dict.py", "                if hit is None or _other_files(info, rec.node, hit):", "                if hit is None:"),
 ("different files only when both are spelled out", "rules/ddp008_save_ddp_state_dict.py", "    return bool(saved) and bool(loaded) and not saved & loaded", "    return not saved & loaded"),
 ("a raise is a failure, not a rank leaving", "analysis/divergence.py", ' or ex.op == "raise" else "DDP019"', ' else "DDP019"'),
 ("a single process may skip", "rules/ddp004_rank_dependent_step_count.py", "    if not info.distributed and not (info.file_set is not None\n                                     and info.file_set.in_group(info)):", "    if False:"),
 ("a module a group imports takes part", "rules/ddp004_rank_dependent_step_count.py", "                                     and info.file_set.in_group(info)):", "                                     and False):"),
 ("a skip on the batch's items", "rules/ddp004_rank_dependent_step_count.py", "if isinstance(g.iter, ast.Name) and g.iter.id in names", "if False"),
 ("a rank's own non-finite loss", "rules/ddp004_rank_dependent_step_count.py", "            loss = _local_nonfinite(info, node, s)\n            if loss is not None:", "            loss = None\n            if loss is not None:"),
 ("a non-finite test only of a loss", "rules/ddp004_rank_dependent_step_count.py", ' and "loss" in n.id.lower()]', "]"),
 ("a loss that went through a collective is shared", "rules/ddp004_rank_dependent_step_count.py", "    if any(is_collective(r) or any(w in r.last.lower() for w in _SHARED) for r in before):\n        return None\n", ""),
 ("a loader named *_dl", "rules/ddp004_rank_dependent_step_count.py", ' \\\n        or name.endswith("_dl")', ""),
 ("a micro-step counter compared with ==", "rules/ddp013_accumulation_without_no_sync.py", "ast.GtE | ast.Gt | ast.Eq", "ast.GtE | ast.Gt"),
 ("== only against a micro-step count", "rules/ddp013_accumulation_without_no_sync.py", "                and any(_ACCUM.search((dotted(x) or \"\").lower())\n                        for x in [n.left, *n.comparators]):", "                and True:"),
 ("accumulation in a method called once per batch", "rules/ddp013_accumulation_without_no_sync.py", "        scope = [r for r in info.calls if r.func is rec.func and not r.loops]\n    outside", "        scope = []\n    outside"),
 ("scaler.step(optimizer=...)", "analysis/context.py", ", *(k.value for k in call.keywords)]", "]"),
 ("a wrapper handed in by another file", "rules/ddp013_accumulation_without_no_sync.py", "    if not info.wraps_ddp:\n        givers = _handed_a_wrapper(info)\n        if not givers or", "    if not info.wraps_ddp:\n        givers = []\n        if True or"),
 ("the giver's no_sync", "rules/ddp013_accumulation_without_no_sync.py", "        if not givers or any(g.no_sync for g in givers):", "        if not givers:"),
 ("a name defined twice in the tree is ambiguous", "analysis/crossfile.py", "                    if len(target) == 1 and target[0] is not caller and any(", "                    if target and target[0] is not caller and any("),
 ("the wrapper, not any argument, is handed in", "analysis/crossfile.py", "                            dotted(a) in wrapped for a in", "                            True for a in"),
 ("the innermost accumulating if first", "rules/ddp013_accumulation_without_no_sync.py", "    return [ifs[k] for k in reversed(arms) if", "    return [ifs[k] for k in arms[:1] if"),
 ("DDP024: the wrapper called in the same step", "rules/ddp024_forward_around_ddp.py", "        if any(dotted(r.node.func) in (owner, f\"{owner}.forward\") for r in scope) \\\n                or not", "        if not"),
 ("DDP024: a training step steps", "rules/ddp024_forward_around_ddp.py", "                or not any(is_optimizer_step(r.node) for r in scope) \\\n", ""),
 ("DDP024: a no_grad decorator", "rules/ddp024_forward_around_ddp.py", "    if any((dotted(d.func if isinstance(d, ast.Call) else d) or \"\").endswith(_NO_GRAD)\n           for d in scope.decorator_list):\n        return True\n", ""),
 ("DDP024: a detached receiver", "rules/ddp024_forward_around_ddp.py", "            if _call_used(receiver, call) or", "            if any(n is call for n in ast.walk(receiver)) or"),
 ("DDP024: no_grad", "rules/ddp024_forward_around_ddp.py", " \\\n                or _under_no_grad(rec):", ":"),
 ("DDP024: detach cuts the graph", "rules/ddp024_forward_around_ddp.py", "        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _CUT:\n            continue\n        todo.extend(ast.iter_child_nodes(n))\n    return False", "        todo.extend(ast.iter_child_nodes(n))\n    return False"),
 ("DDP024: the loss must come from the call", "rules/ddp024_forward_around_ddp.py", "    return False\n\n\ndef _call_used(", "    return True\n\n\ndef _call_used("),
 ("DDP024: flow through assignments", "rules/ddp024_forward_around_ddp.py", "            if _used(value) & tainted:", "            if False:"),
 ("DDP024: gradients synced by hand", "rules/ddp024_forward_around_ddp.py", "        if by_hand:\n            return\n", ""),
 ("only the ifs around the call's line", "rules/ddp013_accumulation_without_no_sync.py", "                    child.lineno <= line <= (child.end_lineno or child.lineno):", "                    True:"),
 ("DDP024: reading the module is no forward", "rules/ddp024_forward_around_ddp.py", "        if type(rec.node.func) is not ast.Attribute or rec.last in _NOT_FORWARD:", "        if type(rec.node.func) is not ast.Attribute:"),
 ("DDP024: a local name only where it was wrapped", "rules/ddp024_forward_around_ddp.py", "            if owner in wrapped and (owner.startswith(\"self.\") or any(\n                    w.func is rec.func for w in info.ddp_wraps(owner))):", "            if owner in wrapped:"),
]


def main() -> int:
    survived = 0
    only = sys.argv[1:]  # substrings of the names to run (all when none)
    for name, f, old, new in M:
        if only and not any(o in name for o in only):
            continue
        p = pathlib.Path(L + f)
        s = p.read_text()
        if old not in s:
            print(f"!! {name}: pattern not found")
            survived += 1
            continue
        p.write_text(s.replace(old, new, 1))
        try:
            tests = sorted(str(t.relative_to(ROOT)) for t in [*ROOT.glob("tests/test_lint*.py"),
                                                               *ROOT.glob("tests/lint/test_*.py")])
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", *tests],
                               capture_output=True, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
            lines = [x for x in r.stdout.splitlines()
                     if "FAILED" in x or "passed" in x or "failed" in x]
            print(f"{'KILLED' if r.returncode else 'SURVIVED'}: {name}: "
                  f"{lines[0] if lines else r.stdout[-200:]}")
            survived += r.returncode == 0
        finally:
            p.write_text(s)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
