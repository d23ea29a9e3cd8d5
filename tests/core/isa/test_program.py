"""Program: the encoded instruction stream is kept while the instructions stay the same."""
from tessera.config import PRESETS
from tessera.isa import Finish, Program, get_isa

TINY = PRESETS["tiny"]


def test_the_stream_is_encoded_once_while_the_instructions_stay():
    prog = Program(TINY, [Finish(), Finish()])
    stream = prog.encode_instructions()
    assert prog.encode_instructions() is stream
    assert stream == get_isa(TINY).encode_program(prog.instructions)


def test_a_changed_instruction_list_is_encoded_again():
    isa = get_isa(TINY)
    prog = Program(TINY, [Finish()])
    first = prog.encode_instructions()
    prog.instructions.insert(0, Finish(push_next=True))
    second = prog.encode_instructions()
    assert second != first and second == isa.encode_program(prog.instructions)
    prog.instructions[0] = Finish(pop_next=True)
    assert prog.encode_instructions() == isa.encode_program(prog.instructions) != second
    assert prog.dram_image()[prog.insn_addr:].tobytes() == prog.encode_instructions()
