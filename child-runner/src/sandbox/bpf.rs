//! One classic BPF program for the whole seccomp policy, which finds the
//! syscall number by binary search.
//!
//! Why not seccompiler's programs: they test the numbers one after the
//! other, one program per action. When a filter is installed, the kernel
//! builds its action cache by emulating the program for every syscall
//! number of every architecture (`seccomp_cache_prepare`, with interrupts
//! off), so a linear program of n rules costs about 900 × n emulated
//! instructions per filter, and each program is JIT-compiled on its own.
//! Here the tree is about 7 levels deep for 70 syscalls, and there is one
//! program to check and compile. Syscalls outside the tree end at
//! `RET ALLOW` with only constant loads on the way, so the kernel still
//! caches them as allowed.
//!
//! Layout: the architecture check (anything else is killed, as
//! seccompiler does), the number loaded, the search (each comparison jumps
//! at most one instruction; farther jumps are `JA`, whose offset is 32
//! bits), then one block per syscall with its rules in order: the first
//! rule whose conditions all hold returns its errno; none holding allows.

use std::collections::BTreeMap;

/// An instruction, as `struct sock_filter`.
pub use seccompiler::sock_filter as Insn;

const BPF_LD: u16 = 0x00;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_ALU: u16 = 0x04;
const BPF_AND: u16 = 0x50;
const BPF_JMP: u16 = 0x05;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGE: u16 = 0x30;
const BPF_RET: u16 = 0x06;
const BPF_K: u16 = 0x00;

/// `offsetof(struct seccomp_data, nr)`, `arch` and `args`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARGS: u32 = 16;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;

/// A test on one argument: `(arg & mask) == value`, or `!=` when
/// `negate`. `wide` compares all 64 bits, else the low 32 (an `int`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    /// The argument, 0 to 5.
    pub arg: u8,
    /// 64 bits rather than 32.
    pub wide: bool,
    /// The bits looked at.
    pub mask: u64,
    /// What they must be.
    pub value: u64,
    /// Holds when they are not.
    pub negate: bool,
}

/// Refuses a syscall with `errno` when all of `conds` hold (always when
/// there are none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Every one must hold.
    pub conds: Vec<Cond>,
    /// The errno returned.
    pub errno: u32,
}

/// The policy: each syscall number's rules, in order.
pub type Policy = BTreeMap<u32, Vec<Rule>>;

/// What a program says for one call: `Some(errno)` or `None` to allow.
/// The reference the compiled program is tested against.
pub fn decide(policy: &Policy, nr: u32, args: &[u64; 6]) -> Option<u32> {
    policy.get(&nr)?.iter().find_map(|r| {
        r.conds
            .iter()
            .all(|c| {
                let low = |x: u64| if c.wide { x } else { x & 0xffff_ffff };
                let v = low(args[usize::from(c.arg)]);
                ((v & low(c.mask)) == low(c.value)) != c.negate
            })
            .then_some(r.errno)
    })
}

/// An instruction whose jump target is a label, resolved at the end.
enum Op {
    Insn(Insn),
    /// `JA` to the label.
    Ja(usize),
    /// A label's position.
    Label(usize),
}

fn stmt(code: u16, k: u32) -> Insn {
    Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}

struct Emitter {
    ops: Vec<Op>,
    labels: usize,
}

impl Emitter {
    fn label(&mut self) -> usize {
        self.labels += 1;
        self.labels - 1
    }

    fn push(&mut self, i: Insn) {
        self.ops.push(Op::Insn(i));
    }

    /// The search over `cases` (sorted numbers with their blocks' labels).
    fn search(&mut self, cases: &[(u32, usize)]) {
        if cases.len() <= 3 {
            for &(nr, block) in cases {
                // Equal: take the JA to the block; else skip it.
                self.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
                self.ops.push(Op::Ja(block));
            }
            self.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
            return;
        }
        let mid = cases.len() / 2;
        let right = self.label();
        self.push(jump(BPF_JMP | BPF_JGE | BPF_K, cases[mid].0, 0, 1));
        self.ops.push(Op::Ja(right));
        self.search(&cases[..mid]);
        self.ops.push(Op::Label(right));
        self.search(&cases[mid..]);
    }

    /// Loads the 32-bit word at `off`, masks it and compares it; jumps to
    /// `fail` when the condition does not hold.
    fn test_word(&mut self, off: u32, mask: u32, value: u32, must_equal: bool, fail: usize) {
        self.push(stmt(BPF_LD | BPF_W | BPF_ABS, off));
        if mask != u32::MAX {
            self.push(stmt(BPF_ALU | BPF_AND | BPF_K, mask));
        }
        // must_equal: equal skips the JA to `fail`; else equal takes it.
        let (jt, jf) = if must_equal { (1, 0) } else { (0, 1) };
        self.push(jump(BPF_JMP | BPF_JEQ | BPF_K, value, jt, jf));
        self.ops.push(Op::Ja(fail));
    }

    fn block(&mut self, rules: &[Rule]) {
        for r in rules {
            let next = self.label();
            for c in &r.conds {
                let off = ARGS + 8 * u32::from(c.arg);
                let (lo_mask, lo_val) = (c.mask as u32, c.value as u32);
                let (hi_mask, hi_val) = if c.wide {
                    ((c.mask >> 32) as u32, (c.value >> 32) as u32)
                } else {
                    (0, 0)
                };
                if !c.negate {
                    self.test_word(off, lo_mask, lo_val, true, next);
                    if hi_mask != 0 || hi_val != 0 {
                        self.test_word(off + 4, hi_mask, hi_val, true, next);
                    }
                } else if hi_mask == 0 && hi_val == 0 {
                    self.test_word(off, lo_mask, lo_val, false, next);
                } else {
                    // Not equal when either half differs.
                    let holds = self.label();
                    self.test_word(off, lo_mask, lo_val, true, holds);
                    self.test_word(off + 4, hi_mask, hi_val, false, next);
                    self.ops.push(Op::Label(holds));
                }
            }
            self.push(stmt(BPF_RET | BPF_K, RET_ERRNO | (r.errno & 0xffff)));
            self.ops.push(Op::Label(next));
        }
        self.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    }
}

/// Compiles `policy` for the architecture `audit_arch` (an
/// `AUDIT_ARCH_*` value).
pub fn compile(policy: &Policy, audit_arch: u32) -> Vec<Insn> {
    let mut e = Emitter {
        ops: Vec::new(),
        labels: 0,
    };
    e.push(stmt(BPF_LD | BPF_W | BPF_ABS, ARCH));
    e.push(jump(BPF_JMP | BPF_JEQ | BPF_K, audit_arch, 1, 0));
    e.push(stmt(BPF_RET | BPF_K, RET_KILL_PROCESS));
    e.push(stmt(BPF_LD | BPF_W | BPF_ABS, NR));
    let cases: Vec<(u32, usize)> = policy.keys().map(|&nr| (nr, e.label())).collect();
    e.search(&cases);
    for (&(_, label), rules) in cases.iter().zip(policy.values()) {
        e.ops.push(Op::Label(label));
        e.block(rules);
    }
    // Resolve: a label is the index of the next instruction.
    let mut at = vec![0usize; e.labels];
    let mut n = 0;
    for op in &e.ops {
        match op {
            Op::Label(l) => at[*l] = n,
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in e.ops {
        match op {
            Op::Insn(i) => out.push(i),
            Op::Ja(l) => {
                // Labels are always ahead: the offset counts from the next
                // instruction.
                let k = at[l] - (out.len() + 1);
                out.push(stmt(BPF_JMP | BPF_JA, k as u32));
            }
            Op::Label(_) => {}
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod interp {
    //! A classic BPF interpreter for the instructions seccomp filters use,
    //! to check compiled programs against [`super::decide`].
    use super::*;

    /// Runs `prog` on one call; returns its return value.
    pub fn run(prog: &[Insn], arch: u32, nr: u32, args: &[u64; 6]) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                NR => nr,
                ARCH => arch,
                o if (ARGS..ARGS + 48).contains(&o) => {
                    let a = args[((o - ARGS) / 8) as usize];
                    if (o - ARGS).is_multiple_of(8) {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                c if c == BPF_LD | BPF_W | BPF_ABS => acc = word(i.k),
                c if c == BPF_ALU | BPF_AND | BPF_K => acc &= i.k,
                c if c == BPF_JMP | BPF_JA => pc += i.k as usize,
                c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                    pc += usize::from(if acc == i.k { i.jt } else { i.jf })
                }
                c if c == BPF_JMP | BPF_JGE | BPF_K => {
                    pc += usize::from(if acc >= i.k { i.jt } else { i.jf })
                }
                // seccompiler's programs also use JGT and JSET.
                0x25 => pc += usize::from(if acc > i.k { i.jt } else { i.jf }),
                0x45 => pc += usize::from(if acc & i.k != 0 { i.jt } else { i.jf }),
                c if c == BPF_RET | BPF_K => return i.k,
                c => panic!("instruction {c:#x}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ARCH_X: u32 = 0xc000_003e;

    fn answer(ret: u32) -> Option<u32> {
        match ret & 0xffff_0000 {
            RET_ALLOW => None,
            RET_ERRNO => Some(ret & 0xffff),
            other => panic!("action {other:#x}"),
        }
    }

    fn sample_policy() -> Policy {
        let mut p = Policy::new();
        for nr in [
            0u32, 1, 5, 9, 10, 11, 50, 51, 52, 100, 200, 300, 301, 435, 499,
        ] {
            p.insert(
                nr,
                vec![Rule {
                    conds: vec![],
                    errno: 1,
                }],
            );
        }
        // Flag bits, a narrow mask, a wide negation, and rules in order.
        p.insert(
            56,
            vec![
                Rule {
                    conds: vec![Cond {
                        arg: 0,
                        wide: true,
                        mask: 0x1000_0000,
                        value: 0x1000_0000,
                        negate: false,
                    }],
                    errno: 1,
                },
                Rule {
                    conds: vec![Cond {
                        arg: 0,
                        wide: true,
                        mask: 1 << 40,
                        value: 1 << 40,
                        negate: false,
                    }],
                    errno: 2,
                },
            ],
        );
        p.insert(
            41,
            vec![Rule {
                conds: vec![Cond {
                    arg: 0,
                    wide: false,
                    mask: u64::MAX,
                    value: 1,
                    negate: true,
                }],
                errno: 97,
            }],
        );
        p.insert(
            90,
            vec![
                Rule {
                    conds: vec![
                        Cond {
                            arg: 1,
                            wide: true,
                            mask: u64::MAX,
                            value: 7 << 33 | 3,
                            negate: true,
                        },
                        Cond {
                            arg: 2,
                            wide: false,
                            mask: 0o4000,
                            value: 0o4000,
                            negate: false,
                        },
                    ],
                    errno: 1,
                },
                Rule {
                    conds: vec![],
                    errno: 38,
                },
            ],
        );
        p
    }

    fn arg_samples() -> Vec<[u64; 6]> {
        let vals = [
            0u64,
            1,
            3,
            0o4000,
            0x1000_0000,
            1 << 40,
            7 << 33 | 3,
            7 << 33,
            u64::MAX,
        ];
        let mut v = Vec::new();
        for &a in &vals {
            for &b in &vals {
                for &c in &[0u64, 0o4000, 0o4755] {
                    v.push([a, b, c, 0, 0, 0]);
                }
            }
        }
        v
    }

    #[test]
    fn the_program_decides_as_the_policy_for_every_number_and_argument() {
        let p = sample_policy();
        let prog = compile(&p, ARCH_X);
        for nr in 0..600 {
            for args in arg_samples() {
                let got = answer(interp::run(&prog, ARCH_X, nr, &args));
                assert_eq!(got, decide(&p, nr, &args), "nr {nr} args {args:?}");
            }
        }
        // Another architecture is killed.
        assert_eq!(
            interp::run(&prog, 0x4000_0003, 1, &[0; 6]),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn conditional_jumps_are_short_and_the_search_is_shallow() {
        let mut p = Policy::new();
        for nr in 0..400 {
            p.insert(
                nr * 3,
                vec![Rule {
                    conds: vec![],
                    errno: 1,
                }],
            );
        }
        let prog = compile(&p, ARCH_X);
        assert!(prog.iter().all(|i| i.jt <= 1 && i.jf <= 1));
        assert!(prog.len() < 4096, "BPF_MAXINSNS");
        // Count the instructions run for an allowed number: about two per
        // level of a tree over 400 numbers.
        for nr in [1u32, 599, 1000] {
            let (mut pc, mut steps) = (0usize, 0);
            loop {
                let i = &prog[pc];
                steps += 1;
                pc += 1;
                if i.code == BPF_RET | BPF_K {
                    break;
                }
                if i.code == BPF_JMP | BPF_JA {
                    pc += i.k as usize;
                } else if i.code == BPF_JMP | BPF_JEQ | BPF_K {
                    pc += usize::from(if nr == i.k { i.jt } else { i.jf });
                } else if i.code == BPF_JMP | BPF_JGE | BPF_K {
                    pc += usize::from(if nr >= i.k { i.jt } else { i.jf });
                }
            }
            assert!(steps <= 30, "{steps} steps for {nr}");
        }
        let empty = compile(&Policy::new(), ARCH_X);
        assert_eq!(answer(interp::run(&empty, ARCH_X, 7, &[0; 6])), None);
    }
}
